"""complete_and_acquire: a worker's completions and its next claim in one transaction
(one statement on Postgres), with exactly what complete_jobs and acquire promise."""

from __future__ import annotations

from typing import Any

import pytest

from queuert_notify.errors import JobOwnershipLostError
from state_adapters.model import Completion, ContinueWith, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.queue_helpers import STATE_KINDS

pytest_plugins = ["tests.support.queue_fixtures"]
pytestmark = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)


async def _start(state: Any, count: int, type_name: str = "t", **options: Any) -> list[str]:
    started = await state.start_chains(
        [NewChain(NewJob(type_name, n), **options) for n in range(count)],
        notes=NotificationBuffer(),
    )
    return [chain.id for chain in started]


def _done(job: Any, output: Any = None) -> Completion:
    return Completion(job.id, job.lease_token, output=output)


async def test_completes_then_claims_the_next_jobs(state: Any) -> None:
    await _start(state, 5)
    first = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=2)
    notes = NotificationBuffer()
    written, claimed = await state.complete_and_acquire(
        [_done(first[0], "a"), _done(first[1], "b")],
        notes=notes,
        type_names=["t"],
        worker_id="w",
        lease_seconds=30,
        limit=2,
    )
    assert written == [None, None]
    assert [job.input for job in claimed] == [2, 3]  # in claim order, fresh leases
    assert all(job.status == "running" and job.lease_token for job in claimed)
    assert (await state.get_chain(first[0].chain_id)).output == "a"
    assert sorted(notes.completed_chains) == sorted(job.chain_id for job in first)
    assert (await state.count_jobs())["running"] == 2


async def test_a_stale_token_changes_nothing_for_that_job_only(state: Any) -> None:
    await _start(state, 3)
    first, second = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=2)
    written, claimed = await state.complete_and_acquire(
        [Completion(first.id, "0" * 32, output=1), _done(second, 2), _done(second, 3)],
        notes=NotificationBuffer(),
        type_names=["t"],
        worker_id="w",
        lease_seconds=30,
        limit=5,
    )
    assert isinstance(written[0], JobOwnershipLostError)
    assert written[1] is None
    assert isinstance(written[2], JobOwnershipLostError)  # completed once, not twice
    assert (await state.get_job(first.id)).status == "running"
    assert (await state.get_chain(second.chain_id)).output == 2
    assert [job.input for job in claimed] == [2]


async def test_continuations_are_created_and_claimable(state: Any) -> None:
    await _start(state, 1)
    (job,) = await state.acquire(["t"], worker_id="w", lease_seconds=30)
    notes = NotificationBuffer()
    follow = ContinueWith(NewJob("t", "next"))
    written, claimed = await state.complete_and_acquire(
        [Completion(job.id, job.lease_token, continue_with=follow)],
        notes=notes,
        type_names=["t"],
        worker_id="w",
        lease_seconds=30,
        limit=1,
    )
    assert written == [None]
    assert notes.scheduled == {"t": 1}
    # Claimed by this call (SQLite runs its statements in turn) or by the next one
    # (on Postgres the claim reads the snapshot the statement started with).
    if not claimed:
        _, claimed = await state.complete_and_acquire(
            [], notes=notes, type_names=["t"], worker_id="w", lease_seconds=30, limit=1
        )
    assert [(j.input, j.chain_id, j.chain_index) for j in claimed] == [("next", job.id, 1)]


async def test_dependents_of_a_finished_chain_are_unblocked(state: Any) -> None:
    (blocker,) = await _start(state, 1)
    (dependent,) = await _start(state, 1, "d", blockers=[blocker])
    (job,) = await state.acquire(["t"], worker_id="w", lease_seconds=30)
    notes = NotificationBuffer()
    written, claimed = await state.complete_and_acquire(
        [_done(job, "x")],
        notes=notes,
        type_names=["t", "d"],
        worker_id="w",
        lease_seconds=30,
        limit=3,
    )
    assert written == [None]
    assert (await state.get_chain(blocker)).status == "completed"
    assert notes.scheduled == {"d": 1}
    # Unblocked in the completing transaction; claimed then or by the next call.
    if not claimed:
        _, claimed = await state.complete_and_acquire(
            [], notes=notes, type_names=["d"], worker_id="w", lease_seconds=30, limit=1
        )
    assert [j.chain_id for j in claimed] == [dependent]


async def test_limit_zero_only_completes(state: Any) -> None:
    await _start(state, 2)
    (job,) = await state.acquire(["t"], worker_id="w", lease_seconds=30)
    written, claimed = await state.complete_and_acquire(
        [_done(job)],
        notes=NotificationBuffer(),
        type_names=["t"],
        worker_id="w",
        lease_seconds=30,
        limit=0,
    )
    assert written == [None] and claimed == []
    assert (await state.count_jobs())["pending"] == 1
