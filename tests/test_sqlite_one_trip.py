"""SQLite: each of the adapter's own transactions is one call into the aiosqlite thread
(state_adapters/sqlite/driver.py). Calls are counted where aiosqlite queues them for
its thread, not timed; a step that would suspend in that thread is refused."""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import aiosqlite.core
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from state_adapters import SqlAlchemyStateAdapter
from state_adapters.database import Conn
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer


class _CountingQueue(SimpleQueue[Any]):
    """aiosqlite's queue of calls for a connection's thread, counting what it is given."""

    calls = 0

    def put_nowait(self, item: Any) -> None:
        _CountingQueue.calls += 1
        super().put_nowait(item)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_CountingQueue]]:
    """Count every call into the aiosqlite threads of connections opened from now on
    (aiosqlite's own methods and SQLAlchemy's adapter alike put them on this queue)."""
    monkeypatch.setattr(aiosqlite.core, "SimpleQueue", _CountingQueue)
    yield _CountingQueue


@pytest.fixture
async def engine(tmp_path: Path, counted: type[_CountingQueue]) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    yield engine
    await engine.dispose()


@pytest.fixture
async def state(engine: AsyncEngine) -> SqlAlchemyStateAdapter:
    adapter = SqlAlchemyStateAdapter(engine, table_prefix="q_")
    await adapter.migrate()
    return adapter


async def _start(state: SqlAlchemyStateAdapter, count: int, type_name: str = "t") -> None:
    chains = [NewChain(NewJob(type_name, n)) for n in range(count)]
    await state.start_chains(chains, notes=NotificationBuffer())


async def test_a_transaction_of_the_adapter_is_one_call_into_the_driver_thread(
    state: SqlAlchemyStateAdapter, counted: type[_CountingQueue]
) -> None:
    await _start(state, 10)
    await state.set_limits(
        "limited", concurrency=5, key_concurrency=None, rate=None, per_seconds=None,
        notes=NotificationBuffer(),
    )  # fmt: skip
    await _start(state, 2, "limited")
    async with state.holding_connections():
        await state.acquire(["t"], worker_id="w", lease_seconds=30)  # opens the lanes
        before = counted.calls
        (job,) = await state.acquire(["t"], worker_id="w", lease_seconds=30)
        assert counted.calls - before == 1  # BEGIN IMMEDIATE, the claim, COMMIT

        before = counted.calls
        done = [Completion(job.id, job.lease_token, "out")]
        lost, claimed = await state.complete_and_acquire(
            done, notes=NotificationBuffer(), type_names=["t"], worker_id="w",
            lease_seconds=30, limit=2,
        )  # fmt: skip
        assert lost == [None] and len(claimed) == 2
        assert counted.calls - before == 1  # the completion, its chain's end, the claim

        before = counted.calls
        await state.renew_lease(claimed[0].id, claimed[0].lease_token, 30)
        await state.set_progress(claimed[0].id, claimed[0].lease_token, {"done": 0.5})
        assert counted.calls - before == 2  # one each

        before = counted.calls
        done = [Completion(j.id, j.lease_token, "out") for j in claimed]
        await state.complete_jobs(done, notes=NotificationBuffer())
        assert counted.calls - before == 1

        await state.acquire(["limited"], worker_id="w", lease_seconds=30, limit=1)
        before = counted.calls
        assert len(await state.acquire(["limited"], worker_id="w", lease_seconds=30)) == 1
        assert counted.calls - before == 1  # the limited type's locking transaction

        before = counted.calls
        await _start(state, 3)
        assert counted.calls - before == 1  # BEGIN IMMEDIATE, two inserts, COMMIT

        # Dedup keys taken and blockers marked in the same call.
        before = counted.calls
        (first,) = await state.start_chains(
            [NewChain(NewJob("t"), dedup_key="k")], notes=NotificationBuffer()
        )
        (again,) = await state.start_chains(
            [NewChain(NewJob("t"), dedup_key="k")], notes=NotificationBuffer()
        )
        await state.start_chains(
            [NewChain(NewJob("t"), blockers=[first.id])], notes=NotificationBuffer()
        )
        assert again.id == first.id and again.deduplicated
        assert counted.calls - before == 3

    before = counted.calls
    await _start(state, 1)
    # No holder: the start keeps its connection for a start right after it (the pool's
    # rollback comes when the connection goes back, once the loop turns).
    assert counted.calls - before == 1


async def test_a_step_that_would_suspend_is_refused_and_rolled_back(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE marks (id INTEGER PRIMARY KEY)"))

    async def suspends(conn: Conn) -> None:
        await conn.exec_driver_sql("INSERT INTO marks VALUES (1)")
        await asyncio.sleep(0)  # waits for the event loop: not allowed in the thread

    async with engine.connect() as conn:
        with pytest.raises(RuntimeError, match="may await only their transaction"):
            await state.database.in_transaction(conn, suspends)

        async def inserts(conn: Conn) -> list[Any]:
            await conn.exec_driver_sql("INSERT INTO marks VALUES (2)")
            return list(await conn.exec_driver_sql("SELECT id FROM marks"))

        # The refused transaction rolled back, and the connection is usable again.
        assert await state.database.in_transaction(conn, inserts) == [(2,)]


async def test_a_failed_statement_is_sqlalchemys_error_and_rolls_back(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE marks (id INTEGER PRIMARY KEY)"))

    async def twice(conn: Conn) -> None:
        await conn.exec_driver_sql("INSERT INTO marks VALUES (1)")
        await conn.exec_driver_sql("INSERT INTO marks VALUES (1)")

    async with engine.connect() as conn:
        with pytest.raises(IntegrityError) as raised:
            await state.database.in_transaction(conn, twice)
        assert isinstance(raised.value.orig, sqlite3.IntegrityError)
        assert not raised.value.connection_invalidated and not conn.invalidated
        assert (await conn.execute(text("SELECT count(*) FROM marks"))).scalar() == 0


async def test_a_closed_driver_connection_is_a_disconnect_that_invalidates(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    async def reads(conn: Conn) -> None:
        await conn.exec_driver_sql("SELECT 1")

    async with engine.connect() as conn:
        fairy = await conn.get_raw_connection()
        assert fairy.driver_connection is not None
        await fairy.driver_connection.close()
        with pytest.raises(DBAPIError) as raised:
            await state.database.in_transaction(conn, reads)
        assert raised.value.connection_invalidated and conn.invalidated


async def test_a_step_sees_the_callers_context_variables(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    current = contextvars.ContextVar("current", default="unset")
    current.set("the caller's")

    async def reads(conn: Conn) -> str:
        return current.get()

    async with engine.connect() as conn:
        assert await state.database.in_transaction(conn, reads) == "the caller's"


async def test_a_claim_cancelled_while_it_waits_for_the_lock_rolls_back(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    await _start(state, 1)
    async with AsyncSession(engine) as session:
        async with session.begin():
            await session.execute(text("SELECT 1"))  # holds the write lock
            claiming = asyncio.ensure_future(state.acquire(["t"], worker_id="w", lease_seconds=30))
            await asyncio.sleep(0.2)  # its BEGIN IMMEDIATE waits in the driver's thread
            claiming.cancel()
        # The lock is free: the cancelled claim runs in its thread, then rolls back.
        with pytest.raises(asyncio.CancelledError):
            await claiming
    (job,) = await state.acquire(["t"], worker_id="w2", lease_seconds=30)
    assert job.attempt == 1 and job.leased_by == "w2"


async def test_completions_with_a_claim_of_paused_and_limited_types_stay_in_the_thread(
    state: SqlAlchemyStateAdapter,
) -> None:
    """A paused type makes the limited types be read again before every claim; within
    the completions' transaction that read would wait for the event loop."""
    notes = NotificationBuffer()
    await state.set_limits(
        "limited", concurrency=2, key_concurrency=None, rate=None, per_seconds=None, notes=notes
    )
    await state.pause_type("paused", notes=notes)
    await _start(state, 3, "limited")
    types = ["limited", "paused"]
    (job,) = await state.acquire(types, worker_id="w", lease_seconds=30)
    for _ in range(3):  # past the limited types' refresh as well
        lost, claimed = await state.complete_and_acquire(
            [Completion(job.id, job.lease_token, "out")], notes=notes, type_names=types,
            worker_id="w", lease_seconds=30, limit=1,
        )  # fmt: skip
        assert lost == [None]
        if not claimed:
            break
        (job,) = claimed
    assert (await state.count_jobs())["completed"] == 3
