"""A worker whose clock disagrees with the database's (libfaketime in its process)
cannot take or suppress the schedule ticks of others, nor reap the live jobs of others:
time shared by workers is read on the database's clock, and the worker warns at start.

SQLite runs inside each worker process, so its clock is that process's own: workers on
one SQLite file share a host and are expected to share its clock (docs/workers.md).
These tests run on Postgres."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client import Client
from tests.support.queue_helpers import wait_until
from tests.support.worker_processes import WorkerProcesses

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("state_kind", ["postgres"], indirect=True),
    pytest.mark.parametrize("notify_kind", ["noop"], indirect=True),
]

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def ahead(seconds: int) -> dict[str, str]:
    """The environment of a worker process whose wall clock runs ``seconds`` ahead
    (its monotonic clock, which timers use, is left alone)."""
    if not LIBFAKETIME.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{LIBFAKETIME} is missing (apt-get install faketime; ./dev test does)")
        pytest.skip("libfaketime is not installed (./dev test installs it)")
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"+{seconds}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


async def _started(workers: WorkerProcesses, *names: str) -> None:
    async def all_started() -> bool:
        return all(f"worker {name}" in workers.log(name) for name in names)

    await wait_until(all_started, timeout=60, interval=0.2)


async def _ticks(client: Client) -> list[datetime]:
    ticks = []
    after = None
    while True:
        page = await client.list_chains(limit=1000, after=after)
        for chain in page.items:
            job = await client.get_job(chain.id)
            ticks.append(datetime.fromisoformat(job.input["tick"]))
        if page.next_cursor is None:
            return ticks
        after = page.next_cursor


async def test_a_worker_whose_clock_runs_ahead_neither_takes_nor_silences_ticks(
    client: Client, workers: WorkerProcesses, effects: Any
) -> None:
    settings = {"QT_CONCURRENCY": "4", "QT_POLL": "0.5", "QT_SCHEDULE_EVERY": "1"}
    sound = workers.start("sound", **settings)
    fast = workers.start("fast", **settings, **ahead(20))
    await _started(workers, "sound", "fast")
    await asyncio.sleep(4)
    fast.kill()
    fast.wait(10)
    killed_at = datetime.now(UTC)
    await asyncio.sleep(4)
    sound.send_signal(signal.SIGTERM)
    assert sound.wait(30) == 0, workers.log("sound")
    stopped_at = datetime.now(UTC)

    ticks = sorted(await _ticks(client))
    assert ticks, workers.log("sound")
    twice = [tick for tick, n in Counter(ticks).items() if n > 1]
    assert not twice, f"ticks started more than once: {twice}"
    # This process shares the database's host and clock: no tick was taken before it
    # came, and ticks kept coming after the fast worker died.
    assert ticks[-1] <= stopped_at, (ticks[-1], stopped_at)
    after_kill = [tick for tick in ticks if tick > killed_at]
    assert len(after_kill) >= 2, (killed_at, ticks)
    assert "clock" in workers.log("fast"), workers.log("fast")


async def test_a_worker_whose_clock_runs_ahead_reaps_no_live_job(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    """Lease 4 s, renewed every third of it; jobs of 8 s on a sound worker; a worker 30 s
    ahead reaps every second: no job is taken from the sound worker. (The 8 s are the
    test's length: the jobs must outlast the fast worker's start-up and its reaps.)"""
    settings = {"QT_CONCURRENCY": "4", "QT_POLL": "0.5", "QT_LEASE": "4", "QT_REAP": "1"}
    workers.start("sound", **settings)
    await _started(workers, "sound")
    chains = [await client.start_chain("effect", {"sleep": 8}) for _ in range(4)]

    async def all_running() -> bool:
        return (await client.state.count_jobs()).get("running", 0) == 4

    await wait_until(all_running, timeout=30, interval=0.1)
    workers.start("fast", **settings, **ahead(30))
    await _started(workers, "fast")
    for chain in chains:
        await client.await_chain(chain.id, timeout=60)
    jobs = [await client.get_job(chain.id) for chain in chains]
    assert [job.status for job in jobs] == ["completed"] * 4
    assert [job.attempt for job in jobs] == [1] * 4, workers.log("fast")
    async with engine.connect() as conn:
        ran_by = [row.worker_id for row in await conn.execute(select(effects.c.worker_id))]
    assert ran_by == ["sound"] * 4
    assert "clock" in workers.log("fast"), workers.log("fast")
