"""A staged-mode worker process SIGKILLed while it holds leases: its jobs are reaped
after the lease and completed once by another worker, and whatever the dead worker
might still write with its old lease tokens is refused and changes nothing."""

from __future__ import annotations

import dataclasses
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.errors import JobOwnershipLostError
from state_adapters.model import Completion, ContinueWith, JobRecord, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.queue_helpers import wait_until
from tests.support.worker_processes import WorkerProcesses, effect_counts

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]

JOBS = 5
LEASE = "5"
"""Seconds; renewed every third of it, so a live worker keeps its jobs through a stall
of a loaded machine (a lost lease would run a staged job's side effect twice)."""


async def _replay_late_writes(state: Any, tokens: dict[str, str]) -> None:
    """Every write a worker makes for a job, with the dead worker's lease tokens: each
    must be refused."""
    for job_id, token in tokens.items():
        with pytest.raises(JobOwnershipLostError):
            await state.renew_lease(job_id, token, 60)
        with pytest.raises(JobOwnershipLostError):
            await state.set_progress(job_id, token, {"late": True})
        with pytest.raises(JobOwnershipLostError):
            await state.fail_job(job_id, token, "late failure", notes=NotificationBuffer())
        late = [
            Completion(job_id, token, output={"worker": "first"}),
            Completion(job_id, token, continue_with=ContinueWith(NewJob("effect"))),
        ]
        for completion in late:
            (outcome,) = await state.complete_jobs([completion], notes=NotificationBuffer())
            assert isinstance(outcome, JobOwnershipLostError)


async def _jobs(client: Client, chain_ids: list[str]) -> list[JobRecord]:
    return [await client.get_job(chain_id) for chain_id in chain_ids]


def _without_lease_expiry(jobs: list[JobRecord]) -> list[JobRecord]:
    """The jobs as a late write could change them; the holder's renewals move
    ``leased_until`` meanwhile, so that is checked apart."""
    return [dataclasses.replace(job, leased_until=None) for job in jobs]


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
async def test_sigkilled_staged_workers_jobs_complete_once_and_its_late_writes_are_refused(
    client: Client,
    state: Any,
    workers: WorkerProcesses,
    effects: Any,
    engine: Any,
    tmp_path: Path,
) -> None:
    # Attempt 1 never finishes (its worker dies); attempt 2 waits at the gate until the
    # late writes were replayed while the other worker holds the job.
    gate = tmp_path / "gate"
    specs = [ChainSpec("effect", {"gate": str(gate)})] * JOBS
    chain_ids = [started.id for started in await client.start_chains(specs)]
    first = workers.start("first", QT_MODE="staged", QT_LEASE=LEASE, QT_POLL="0.5")

    async def all_running_on(worker_id: str) -> bool:
        jobs = await _jobs(client, chain_ids)
        return all(j.status == "running" and j.leased_by == worker_id for j in jobs)

    await wait_until(lambda: all_running_on("first"), timeout=30, interval=0.1)
    tokens = {j.id: j.lease_token for j in await _jobs(client, chain_ids) if j.lease_token}
    assert len(tokens) == JOBS
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    second = workers.start("second", QT_MODE="staged", QT_LEASE=LEASE, QT_POLL="0.5", QT_REAP="0.5")
    await wait_until(lambda: all_running_on("second"), timeout=30, interval=0.05)
    held = await _jobs(client, chain_ids)
    await _replay_late_writes(state, tokens)
    after = await _jobs(client, chain_ids)
    gate.touch()
    assert _without_lease_expiry(after) == _without_lease_expiry(held), (
        "a late write changed a job another worker holds"
    )
    # The late renewal asked for 60 s; the holder renews for LEASE seconds at a time.
    horizon = datetime.now(UTC) + timedelta(seconds=20)
    assert all(j.leased_until and _aware(j.leased_until) < horizon for j in after)

    done = [
        await client.await_chain(chain_id, timeout=30, poll_interval=0.2) for chain_id in chain_ids
    ]
    assert [chain.status for chain in done] == ["completed"] * JOBS, workers.log("second")
    assert {(chain.output["worker"], chain.last_job.attempt) for chain in done} == {("second", 2)}
    assert [chain.last_job.chain_index for chain in done] == [0] * JOBS
    finished = await _jobs(client, chain_ids)
    await _replay_late_writes(state, tokens)
    assert await _jobs(client, chain_ids) == finished, "a late write changed a completed job"
    assert {s: n for s, n in (await client.count_jobs()).items() if n} == {"completed": JOBS}
    # The dead worker was killed before its side effect; the second ran it once each.
    assert await effect_counts(engine, effects) == (JOBS, JOBS)

    second.send_signal(signal.SIGTERM)
    assert second.wait(15) == 0, workers.log("second")
