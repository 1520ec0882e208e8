"""Every Postgres driver an application may already use: ``Client`` and the worker on
psycopg 3 and asyncpg engines, ``SyncClient`` on psycopg 3 and psycopg2 engines, each
joining the caller's transaction; an engine of any other driver, or of the wrong kind for
its client, refused in one line before anything is written.

(The conformance kit, limits, schedules, retention, atomic mode and migrations run on
asyncpg too: ``STATE_KINDS`` and ``async_postgres_url`` in the fixtures.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from queuert_notify import (
    ChainNotFoundError,
    Client,
    ConfigurationError,
    InProcessNotifyAdapter,
    JobOwnershipLostError,
    SyncClient,
)
from queuert_notify.cli import main
from queuert_notify.dashboard import create_app
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.drivers import async_driver_for, run_on_driver
from state_adapters.drivers.psycopg import _CURSORS
from state_adapters.notifications import NotificationBuffer
from tests.conftest import with_driver
from tests.support.queue_helpers import drop_tables


@pytest.fixture
async def engine(async_postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_postgres_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.fixture
async def client(engine: AsyncEngine, prefix: str) -> AsyncIterator[Client]:
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        yield client


async def _jobs(engine: AsyncEngine, prefix: str) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text(f"SELECT count(*) FROM {prefix}_jobs")) or 0)


async def test_a_caller_transaction_that_starts_with_the_queues_statement_rolls_it_back(
    client: Client, engine: AsyncEngine, prefix: str
) -> None:
    # The start is the session's first statement: on asyncpg, SQLAlchemy begins the
    # transaction lazily, so a queue statement sent outside it would survive the rollback.
    woken: list[str] = []
    await client.notify.listen_job_scheduled(["t"], woken.append)
    async with AsyncSession(engine) as session:
        await session.begin()
        dropped = await client.start_chain("t", {"x": 1}, session=session)
        await session.rollback()
    async with AsyncSession(engine) as session, session.begin():
        kept = await client.start_chain("t", {"x": 2}, session=session)
        await session.execute(text("SELECT 1"))
    with pytest.raises(ChainNotFoundError):
        await client.get_chain(dropped.id)
    assert (await client.get_chain(kept.id)).status == "pending"
    assert await _jobs(engine, prefix) == 1
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert woken == ["t"]


async def test_a_worker_runs_chains_and_atomic_handlers_on_the_engines_driver(
    client: Client, engine: AsyncEngine, prefix: str
) -> None:
    async def record(job: Any, ctx: Any) -> Any:
        await ctx.session.execute(
            text(f"INSERT INTO {prefix}_effects (n) VALUES (:n)"), {"n": job.input["n"]}
        )
        return {"n": job.input["n"]}

    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {prefix}_effects (n int)"))
    try:
        chains = [await client.start_chain("record", {"n": n}) for n in range(20)]
        assert await run_until_idle(client, {"record": record}) == 20
        for chain in chains:
            assert (await client.get_chain(chain.id)).status == "completed"
        async with engine.connect() as conn:
            effects = await conn.scalar(text(f"SELECT count(DISTINCT n) FROM {prefix}_effects"))
        assert effects == 20
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE {prefix}_effects"))


async def test_failed_attempts_go_to_the_driver_as_one_statement_with_the_delays_bound(
    client: Client, engine: AsyncEngine
) -> None:
    sent: list[tuple[Any, str]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE") and "last_error" in statement:
            sent.append((cursor, statement))

    for n in range(3):
        await client.start_chain("t", {"n": n})
    state = client.state
    jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=3)
    assert len(jobs) == 3
    tokens = [job.lease_token or "" for job in jobs]
    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        soon = await state.fail_job(
            jobs[0].id, tokens[0], "boom", notes=NotificationBuffer(), retry_delay=60
        )
        later = await state.fail_job(
            jobs[1].id, tokens[1], "boom", notes=NotificationBuffer(), retry_delay=3600
        )
        final = await state.fail_job(
            jobs[2].id, tokens[2], "boom", notes=NotificationBuffer(), retry_delay=60, final=True
        )
        with pytest.raises(JobOwnershipLostError):
            await state.fail_job(
                jobs[0].id, tokens[0], "again", notes=NotificationBuffer(), retry_delay=1
            )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert (soon.status, later.status, final.status) == ("pending", "pending", "failed")
    assert soon.retry_at is not None and later.retry_at is not None
    assert timedelta(seconds=3500) < later.retry_at - soon.retry_at < timedelta(seconds=3600)
    # On the driver connection (no SQLAlchemy cursor), and of one shape whatever the
    # delay, finality or error: they are bound, so the statement is compiled once.
    assert len(sent) == 4 and {cursor for cursor, _ in sent} == {None}
    assert len({statement for _, statement in sent}) == 1


async def test_the_dashboard_reads_through_the_engines_driver(client: Client) -> None:
    chain = await client.start_chain("email", {"to": "a@b.c"})
    await client.set_limits("email", concurrency=2)
    app = create_app(client.state, client.notify)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as h:
        for path in ["/", "/chains", f"/chains/{chain.id}"]:
            response = await h.get(path)
            assert response.status_code == 200, path
            assert "email" in response.text


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg", "psycopg2", None])
def test_the_cli_takes_each_postgres_url(
    postgres_url: str, prefix: str, driver: str | None
) -> None:
    url = with_driver(postgres_url, driver or "psycopg")
    if driver is None:  # as an application's settings may hold it
        url = url.replace("postgresql+psycopg://", "postgresql://")
    common = ["--database-url", url, "--table-prefix", f"{prefix}_"]
    runner = CliRunner()
    try:
        migrated = runner.invoke(main, ["migrate", *common])
        assert migrated.exit_code == 0, migrated.output
        listed = runner.invoke(main, ["chains", "list", *common])
        assert listed.exit_code == 0, listed.output
    finally:
        engine = create_engine(with_driver(postgres_url, "psycopg"))
        with engine.begin() as conn:
            for (name,) in conn.execute(
                text("SELECT tablename FROM pg_tables WHERE tablename LIKE :p"),
                {"p": f"{prefix}\\_%"},
            ):
                conn.execute(text(f'DROP TABLE IF EXISTS "{name}" CASCADE'))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {prefix}_claim_limited CASCADE"))
        engine.dispose()


# -- SyncClient ---------------------------------------------------------------------------


@pytest.fixture
def sync_engine(sync_postgres_url: str, prefix: str) -> Iterator[Engine]:
    engine = create_engine(sync_postgres_url)
    try:
        yield engine
    finally:
        with engine.begin() as conn:
            for (name,) in conn.execute(
                text("SELECT tablename FROM pg_tables WHERE tablename LIKE :p"),
                {"p": f"{prefix}\\_%"},
            ):
                conn.execute(text(f'DROP TABLE IF EXISTS "{name}" CASCADE'))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {prefix}_claim_limited CASCADE"))
        engine.dispose()


def test_a_sync_caller_transaction_that_starts_with_the_queues_statement_rolls_it_back(
    sync_engine: Engine, prefix: str
) -> None:
    with SyncClient(sync_engine, table_prefix=f"{prefix}_") as client:
        client.migrate()
        with Session(sync_engine) as session:
            session.begin()
            dropped = client.start_chain("t", {"x": 1}, session=session)
            session.rollback()
        with Session(sync_engine) as session, session.begin():
            kept = client.start_chain("t", {"x": 2}, dedup_key="k", session=session)
        again = client.start_chain("t", {"x": 3}, dedup_key="k")
        with pytest.raises(ChainNotFoundError):
            client.get_chain(dropped.id)
        assert client.get_chain(kept.id).last_job.input == {"x": 2}
        assert again.deduplicated and again.id == kept.id
        with sync_engine.connect() as conn:
            assert conn.scalar(text(f"SELECT count(*) FROM {prefix}_jobs")) == 1


# -- engines a client does not take -------------------------------------------------------


async def test_an_async_engine_given_to_sync_client_names_client(postgres_url: str) -> None:
    engine = create_async_engine(with_driver(postgres_url, "asyncpg"))
    try:
        with pytest.raises(TypeError) as raised:
            SyncClient(engine)  # type: ignore[arg-type]
    finally:
        await engine.dispose()
    message = str(raised.value)
    assert "\n" not in message
    assert "queuert_notify.Client" in message
    assert "postgresql+psycopg2://" in message


def test_a_sync_engine_of_an_async_driver_given_to_sync_client_names_client(
    postgres_url: str,
) -> None:
    engine = create_engine(with_driver(postgres_url, "asyncpg"))
    with pytest.raises(ConfigurationError) as raised:
        SyncClient(engine)
    message = str(raised.value)
    assert "\n" not in message
    assert "queuert_notify.Client" in message
    assert "postgresql+psycopg2://" in message


def test_a_psycopg2_engine_given_to_the_async_adapter_names_sync_client(
    postgres_url: str, prefix: str
) -> None:
    engine = create_engine(with_driver(postgres_url, "psycopg2"))
    with pytest.raises(ConfigurationError) as raised:
        SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")  # type: ignore[arg-type]
    message = str(raised.value)
    assert "\n" not in message
    assert "SyncClient" in message
    assert "postgresql+asyncpg://" in message
    with engine.connect() as conn:  # nothing was written
        tables = conn.scalar(
            text("SELECT count(*) FROM pg_tables WHERE tablename LIKE :p"), {"p": f"{prefix}%"}
        )
    engine.dispose()
    assert tables == 0


async def test_a_kept_psycopg_cursor_holds_no_rows_or_arguments_between_statements(
    postgres_url: str,
) -> None:
    engine = create_async_engine(with_driver(postgres_url, "psycopg"))
    big = "x" * 1_000_000
    try:
        async with engine.connect() as conn:
            sql = "SELECT %(value)s::text FROM generate_series(1, 5)"
            rows = await run_on_driver(async_driver_for("psycopg"), conn, sql, {"value": big})
            kept = conn.sync_connection.connection.info[_CURSORS]  # type: ignore[union-attr]

            assert [row[0] for row in rows] == [big] * 5
            # Kept for the statement's next run, without the 5 MB it returned or the
            # argument it sent (a claim's inputs, a completion's outputs).
            assert list(kept) == [sql]
            cursor = kept[sql]
            assert (cursor.pgresult, cursor._tx.pgresult, cursor._query) == (None, None, None)
            again = await run_on_driver(async_driver_for("psycopg"), conn, sql, {"value": "y"})
            assert [row[0] for row in again] == ["y"] * 5 and kept[sql] is cursor
    finally:
        await engine.dispose()
