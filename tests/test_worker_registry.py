"""The worker registry: a running worker is listed with what it handles, beats with
one write per tick and nothing per job, is gone after a clean stop; a job type that no
live worker handles is warned about. Real SQLite and Postgres."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify import SyncClient
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from state_adapters.model import WORKER_DEAD_AFTER, unhandled_types
from tests.support.queue_helpers import wait_until

pytest_plugins = ["tests.support.queue_fixtures"]

BOTH = pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)


async def done(job: Job, ctx: JobContext) -> str:
    return "ok"


@pytest.fixture
def writes_to_workers(engine: AsyncEngine, table_prefix: str) -> Iterator[list[str]]:
    """The first word (INSERT, UPDATE, DELETE) of every write to the workers table."""
    seen: list[str] = []
    table = f"{table_prefix}workers"

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper()
        if table in statement and verb in ("INSERT", "UPDATE", "DELETE"):
            seen.append(verb)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine.sync_engine, "before_cursor_execute", record)


@BOTH
async def test_a_running_worker_is_listed_until_it_stops(
    client: Client, sync_engine: Engine, table_prefix: str
) -> None:
    worker = Worker(client, {"charge": done, "refund": done}, concurrency=3, worker_id="w-1")
    async with worker:
        await wait_until(lambda: client.workers(), timeout=10)
        (listed,) = await client.workers()
        assert (listed.id, listed.type_names, listed.slots) == ("w-1", ("charge", "refund"), 3)
        assert (listed.host, listed.pid) == (socket.gethostname(), os.getpid())
        assert listed.alive(datetime.now(UTC))
        assert SyncClient(sync_engine, table_prefix=table_prefix).workers() == [listed]
    assert await client.workers() == []


async def test_a_worker_beats_with_one_write_per_tick_and_none_per_job(
    client: Client, writes_to_workers: list[str]
) -> None:
    async with Worker(client, {"charge": done}, reap_interval=0.1, jitter=0.0) as worker:
        await wait_until(lambda: writes_to_workers.count("UPDATE") >= 5, timeout=10)
        chains = [await client.start_chain("charge", {"n": n}) for n in range(30)]
        for chain in chains:
            await client.await_chain(chain.id, timeout=10)
        await worker.stop()
    # Start: its old row (and rows dead for a day) deleted, its row inserted; then one
    # UPDATE per tick; the clean stop deletes the row.
    assert writes_to_workers[:2] == ["DELETE", "INSERT"]
    assert set(writes_to_workers[2:-1]) == {"UPDATE"}
    assert writes_to_workers[-1] == "DELETE"


async def test_jobs_piling_up_for_one_hot_worker_cost_the_registry_nothing(
    client: Client, writes_to_workers: list[str]
) -> None:
    async with Worker(client, {"charge": done}, reap_interval=600) as worker:
        await wait_until(lambda: writes_to_workers == ["DELETE", "INSERT"], timeout=10)
        chains = [await client.start_chain("charge", {"n": n}) for n in range(50)]
        for chain in chains:
            await client.await_chain(chain.id, timeout=10)
        assert writes_to_workers == ["DELETE", "INSERT"]
        await worker.stop()


@BOTH
async def test_a_typod_type_is_warned_about_by_a_running_worker(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    await client.start_chain("chrage", {"order": 1})
    await client.start_chain("chrage", {"order": 2})
    await client.start_chain("charge", {"order": 3}, delay=3600)  # handled: no warning
    caplog.set_level(logging.WARNING, logger="queuert_notify.maintenance.registration")
    async with Worker(client, {"charge": done, "refund": done}):
        await wait_until(lambda: "chrage" in caplog.text, timeout=10)
    (line,) = [r.getMessage() for r in caplog.records if "no live worker" in r.getMessage()]
    assert line == (
        "2 jobs of type 'chrage' are due and no live worker handles that type; "
        "known types: charge, refund"
    )


async def test_a_worker_without_a_heartbeat_counts_as_dead(
    client: Client, engine: AsyncEngine, state: Any
) -> None:
    long_ago = datetime.now(UTC) - timedelta(seconds=WORKER_DEAD_AFTER + 1)
    async with engine.begin() as conn:
        await conn.execute(
            insert(state.tables.workers).values(
                id="gone",
                host="h",
                pid=1,
                type_names=["charge"],
                slots=1,
                started_at=long_ago,
                heartbeat_at=long_ago,
            )
        )
    (gone,) = await client.workers()
    assert not gone.alive(datetime.now(UTC))
    await client.start_chain("charge")
    assert await client.state.due_jobs_by_type() == {"charge": 1}
    # Its types count as unhandled.
    assert unhandled_types({"charge": 1}, [gone], datetime.now(UTC)) == {"charge": 1}
