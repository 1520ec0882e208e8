"""SQLite fit for more than demos: WAL, a long busy timeout, BEGIN IMMEDIATE for writes,
reads that do not queue behind writers, and two processes that never share a job."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from queuert_notify.errors import ConfigurationError
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from state_adapters.sqlite.connections import SQLITE_BUSY_TIMEOUT_MS

REPO = Path(__file__).resolve().parent.parent
PREFIX = "q_"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture
async def engine(db_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}")
    yield engine
    await engine.dispose()


@pytest.fixture
async def state(engine: AsyncEngine) -> SqlAlchemyStateAdapter:
    adapter = SqlAlchemyStateAdapter(engine, table_prefix=PREFIX)
    await adapter.migrate()
    return adapter


async def _start(state: SqlAlchemyStateAdapter, count: int) -> list[str]:
    started = await state.start_chains(
        [NewChain(NewJob("t", n)) for n in range(count)], notes=NotificationBuffer()
    )
    return [s.id for s in started]


async def test_connections_use_wal_and_a_long_busy_timeout(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    async with engine.begin() as conn:
        assert await conn.scalar(text("PRAGMA journal_mode")) == "wal"
        assert await conn.scalar(text("PRAGMA busy_timeout")) == SQLITE_BUSY_TIMEOUT_MS
        # NORMAL (1): under WAL, commits survive a crash of the process, not of the OS.
        assert await conn.scalar(text("PRAGMA synchronous")) == 1


async def test_sqlite_synchronous_full_syncs_every_commit(db_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}")
    try:
        SqlAlchemyStateAdapter(engine, table_prefix=PREFIX, sqlite_synchronous="FULL")
        async with engine.begin() as conn:
            assert await conn.scalar(text("PRAGMA synchronous")) == 2
    finally:
        await engine.dispose()


async def test_an_unknown_sqlite_synchronous_is_refused(engine: AsyncEngine) -> None:
    with pytest.raises(ConfigurationError, match="sqlite_synchronous must be 'NORMAL' or 'FULL'"):
        SqlAlchemyStateAdapter(engine, sqlite_synchronous="OFF")  # type: ignore[arg-type]


async def test_connections_pooled_before_the_adapter_existed_are_configured_too(
    db_path: Path,
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}")
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        SqlAlchemyStateAdapter(engine, table_prefix=PREFIX)
        async with engine.begin() as conn:
            assert await conn.scalar(text("PRAGMA busy_timeout")) == SQLITE_BUSY_TIMEOUT_MS
    finally:
        await engine.dispose()


async def test_an_application_transaction_on_the_engine_takes_the_write_lock_up_front(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, db_path: Path
) -> None:
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(text("SELECT 1"))
        # Another writer cannot start: this transaction began IMMEDIATE, so a
        # later write in it can never fail with "database is locked".
        other = sqlite3.connect(db_path, timeout=0, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()


async def test_reads_do_not_wait_for_a_writer(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    (chain_id,) = await _start(state, 1)
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(text("SELECT 1"))  # holds the write lock
        async with asyncio.timeout(2):
            assert (await state.get_chain(chain_id)).status == "pending"
            assert await state.next_due_at(["t"]) is not None
            assert (await state.count_jobs())["pending"] == 1
            assert len((await state.list_chains()).items) == 1


async def test_a_writer_waits_for_the_lock_instead_of_failing(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    await _start(state, 1)
    async with AsyncSession(engine) as session:
        async with session.begin():
            await session.execute(text("SELECT 1"))
            claiming = asyncio.ensure_future(state.acquire(["t"], worker_id="w", lease_seconds=30))
            await asyncio.sleep(0.3)
            assert not claiming.done()
        assert len(await claiming) == 1


@pytest.mark.slow
async def test_two_processes_on_one_file_never_claim_the_same_job(
    state: SqlAlchemyStateAdapter, db_path: Path
) -> None:
    ids = await _start(state, 300)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.sqlite_claimer",
            str(db_path),
            PREFIX,
            f"proc-{n}",
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(2)
    ]
    try:
        async with asyncio.timeout(120):
            for proc in procs:
                assert proc.stdout is not None
                assert await proc.stdout.readline() == b"ready\n"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            outputs = [await proc.communicate() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode(errors="replace")
    claimed = [line.decode().split() for line, _ in outputs]
    per_process = [set(ids_) for ids_ in claimed]
    all_claims = [job_id for ids_ in claimed for job_id in ids_]
    assert len(all_claims) == len(set(all_claims)) == 300
    assert set(all_claims) == set(ids)
    assert all(per_process), "both processes should have claimed something"
    counts = await state.count_jobs()
    assert counts["completed"] == 300
    assert {job.attempt for job in (await state.list_jobs(limit=300)).items} == {1}
