"""Schedules run by workers: a new schedule waits for its next tick, downtime is caught up
with one run, and a schedule removed from the code stops."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify import Client, Schedule, Worker
from queuert_notify.jobs import Job, JobContext
from tests.support.queue_helpers import DATABASES, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]

pytestmark = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)

HOURLY = Schedule("hourly", "report", every=timedelta(hours=1), input={"kind": "hourly"})


async def _report(job: Job, ctx: JobContext) -> Any:
    return job.input


async def _chains(client: Client) -> list[Any]:
    return list((await client.list_chains(limit=1000)).items)


async def test_a_new_schedule_waits_for_its_next_tick(client: Client) -> None:
    async with Worker(client, {"report": _report}, schedules=[HOURLY], poll_interval=0.2):
        await wait_until(lambda: client.state.schedule_ticks(["hourly"]), timeout=10)
        await asyncio.sleep(0.5)
    assert await _chains(client) == []
    recorded = await client.state.schedule_ticks(["hourly"])
    assert recorded == {"hourly": HOURLY.latest_tick(datetime.now(UTC))}


async def test_after_downtime_a_schedule_catches_up_with_one_run(
    client: Client, engine: AsyncEngine, state: Any
) -> None:
    async with Worker(client, {"report": _report}, schedules=[HOURLY], poll_interval=0.2):
        await wait_until(lambda: client.state.schedule_ticks(["hourly"]), timeout=10)
    # Five hours of downtime: the last tick taken was five ticks ago.
    (last,) = (await client.state.schedule_ticks(["hourly"])).values()
    async with engine.begin() as conn:
        await conn.execute(
            update(state.tables.schedules).values(last_tick=last - timedelta(hours=5))
        )
    workers = [
        Worker(client, {"report": _report}, schedules=[HOURLY], poll_interval=0.2) for _ in range(3)
    ]
    async with workers[0], workers[1], workers[2]:
        await wait_until(lambda: _completed(client, 1), timeout=10)
        await asyncio.sleep(1.0)
    (chain,) = await _chains(client)
    latest = HOURLY.latest_tick(datetime.now(UTC))
    assert chain.output == {"kind": "hourly", "tick": latest.isoformat()}


async def test_a_schedule_removed_from_the_code_stops(
    client: Client, engine: AsyncEngine, state: Any
) -> None:
    every_second = Schedule("every-second", "report", every=timedelta(seconds=1))
    async with Worker(client, {"report": _report}, schedules=[every_second], poll_interval=0.2):
        await wait_until(lambda: _completed(client, 1), timeout=10)
    ran = len(await _chains(client))
    async with Worker(client, {"report": _report}, poll_interval=0.2):
        await asyncio.sleep(2.5)
    assert len(await _chains(client)) == ran


async def _completed(client: Client, count: int) -> bool:
    return (await client.count_jobs()).get("completed", 0) >= count
