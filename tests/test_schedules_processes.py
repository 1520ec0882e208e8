"""Schedules carried by several worker processes (started through the CLI): one chain per
tick, whoever takes it, and the ticks keep coming."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client.client import Client
from tests.support.queue_helpers import wait_until
from tests.support.worker_processes import WorkerProcesses, effect_counts

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]


async def _chain_ticks(client: Client) -> list[datetime]:
    """The tick of every chain started so far (one per chain)."""
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


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["noop"], indirect=True)
async def test_three_worker_processes_start_exactly_one_chain_per_tick(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    # A tick every half second: the ten ticks take five seconds instead of ten, and the
    # three schedulers race for a tick twice as often.
    procs = [
        workers.start(name, QT_CONCURRENCY="8", QT_POLL="0.5", QT_SCHEDULE_EVERY="0.5")
        for name in ("a", "b", "c")
    ]

    async def all_started() -> bool:
        return all(f"worker {name}" in workers.log(name) for name in ("a", "b", "c"))

    await wait_until(all_started, timeout=60, interval=0.2)

    async def ten_ticks() -> bool:
        return len(await _chain_ticks(client)) >= 10

    # Ticks keep coming: ten of them, however long a loaded machine takes (a stall of
    # all three processes may skip a tick: a scheduler takes only the latest one due).
    await wait_until(ten_ticks, timeout=90, interval=0.5)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc, name in zip(procs, ("a", "b", "c"), strict=True):
        assert proc.wait(30) == 0, workers.log(name)

    ticks = sorted(await _chain_ticks(client))
    twice = [tick for tick, n in Counter(ticks).items() if n > 1]
    assert not twice, f"ticks started more than once: {twice}"
    # Every chain is one of the schedule's ticks: whole half seconds apart.
    halves = [(b - a).total_seconds() * 2 for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 10 and all(h >= 1.0 and h.is_integer() for h in halves), ticks
    rows, distinct = await effect_counts(engine, effects)
    assert rows == distinct <= len(ticks)
