"""Workers in separate processes (started through the CLI): crashes lose nothing and
every job completes exactly once."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from tests.support.queue_helpers import wait_until
from tests.support.worker_processes import WorkerProcesses, effect_counts

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["noop", "redis"], indirect=True)
async def test_sigkilled_worker_loses_nothing_and_the_job_completes_exactly_once(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    chain = await client.start_chain("effect", {"first_attempt_sleep": 60})
    # A lease that outlives a stall of a loaded machine: a first worker that lost it
    # would run the job again itself.
    first = workers.start("first", QT_LEASE="5", QT_POLL="0.5")

    async def claimed_by_first() -> bool:
        job = await client.get_job(chain.id)
        return job.status == "running" and job.leased_by == "first"

    await wait_until(claimed_by_first, timeout=30, interval=0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    second = workers.start("second", QT_LEASE="2", QT_POLL="0.5", QT_REAP="0.5")
    done = await client.await_chain(chain.id, timeout=30, poll_interval=0.2)
    assert done.status == "completed", workers.log("second")
    assert done.output == {"worker": "second"}
    assert done.last_job.attempt == 2
    assert await effect_counts(engine, effects) == (1, 1)

    # SIGTERM drains and exits cleanly.
    second.send_signal(signal.SIGTERM)
    assert second.wait(15) == 0, workers.log("second")


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["noop", "redis"], indirect=True)
async def test_two_worker_processes_complete_2000_jobs_exactly_once(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    total = 2000
    for start in range(0, total, 1000):
        await client.start_chains(
            [ChainSpec("effect", {"n": n}) for n in range(start, start + 1000)]
        )
    began = time.monotonic()
    procs = [workers.start(name, QT_CONCURRENCY="8", QT_POLL="0.5") for name in ("a", "b")]

    async def all_completed() -> bool:
        counts = await client.count_jobs()
        return counts.get("completed", 0) == total

    await wait_until(all_completed, timeout=180, interval=0.5)
    elapsed = time.monotonic() - began
    assert await effect_counts(engine, effects) == (total, total)
    counts = await client.count_jobs()
    assert {status: n for status, n in counts.items() if n} == {"completed": total}
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, name in zip(procs, ("a", "b"), strict=True):
        assert proc.wait(15) == 0, workers.log(name)
    async with engine.connect() as conn:
        per_worker = dict(
            (
                await conn.execute(
                    select(effects.c.worker_id, func.count()).group_by(effects.c.worker_id)
                )
            ).all()
        )
    assert set(per_worker) == {"a", "b"}, per_worker
    print(f"{total} jobs by 2 processes x 8 slots in {elapsed:.1f}s: {per_worker}")
