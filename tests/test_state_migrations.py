"""Shipped migrations: idempotent, safe concurrently, in their own version table, and
identical to the tables in state_adapters.schema."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, func, insert, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from state_adapters import SqlAlchemyStateAdapter, make_metadata, metadata
from state_adapters.migrations.runner import config_for
from state_adapters.schema import JsonDocument, ddl_timestamp, make_tables
from tests.support.queue_helpers import drop_tables, head_revision

TABLES = (
    "chains",
    "jobs",
    "blockers",
    "dedup_keys",
    "schedules",
    "type_controls",
    "workers",
    "job_logs",
)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def engine(database_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


def _table_names(sync_conn: Any, schema: str | None = None) -> set[str]:
    return set(inspect(sync_conn).get_table_names(schema=schema))


async def test_migrate_creates_the_tables_and_a_version_table_of_their_own(
    engine: AsyncEngine, prefix: str
) -> None:
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    await state.migrate()
    async with engine.connect() as conn:
        names = await conn.run_sync(_table_names)
        version = await conn.scalar(text(f"SELECT version_num FROM {prefix}_alembic_version"))
    assert {f"{prefix}_{t}" for t in TABLES} | {f"{prefix}_alembic_version"} <= names
    assert version == head_revision()


async def test_concurrent_migrations_all_succeed(database_url: str, prefix: str) -> None:
    engines = [create_async_engine(database_url) for _ in range(3)]
    try:
        adapters = [SqlAlchemyStateAdapter(e, table_prefix=f"{prefix}_") for e in engines]
        await asyncio.gather(*(adapter.migrate() for adapter in adapters))
        async with engines[0].connect() as conn:
            count = await conn.scalar(text(f"SELECT count(*) FROM {prefix}_alembic_version"))
        assert count == 1
    finally:
        await drop_tables(engines[0], f"{prefix}_")
        for e in engines:
            await e.dispose()


async def test_the_migrated_schema_matches_the_exported_metadata(
    engine: AsyncEngine, prefix: str
) -> None:
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    ours = {table.name for table in state.metadata.sorted_tables}

    def diff(sync_conn: Any) -> list[Any]:
        context = MigrationContext.configure(
            sync_conn,
            opts={
                "compare_type": True,
                "include_name": lambda name, kind, _parent: kind != "table" or name in ours,
            },
        )
        return list(compare_metadata(context, state.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


def test_metadata_carries_the_prefix_and_schema() -> None:
    assert sorted(metadata.tables) == sorted(f"queuert_{t}" for t in TABLES)
    custom = make_metadata("app_jobs_", schema="queue")
    assert sorted(custom.tables) == sorted(f"queue.app_jobs_{t}" for t in TABLES)


async def test_an_application_schema_and_alembic_history_are_left_alone(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url)
    schema = f"{prefix}_schema"
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA {schema}"))
            await conn.execute(
                text(f"CREATE TABLE {schema}.alembic_version (version_num varchar(32))")
            )
            await conn.execute(text(f"INSERT INTO {schema}.alembic_version VALUES ('app-rev')"))
        state = SqlAlchemyStateAdapter(engine, schema=schema)
        await state.migrate()
        async with engine.connect() as conn:
            names = await conn.run_sync(_table_names, schema)
            app_version = await conn.scalar(
                text(f"SELECT version_num FROM {schema}.alembic_version")
            )
        assert {f"queuert_{t}" for t in TABLES} <= names
        assert app_version == "app-rev"
        chain = await state.get_chain((await _start(state)).id)
        assert chain.status == "pending"
        # The limited claim's function (migration 0007) is in the schema as well.
        await state.set_limits(
            "t", concurrency=1, key_concurrency=None, rate=None, per_seconds=None, notes=_notes()
        )
        jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=5)
        assert [j.chain_id for j in jobs] == [chain.id]
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await engine.dispose()


async def test_downgrading_below_0007_drops_the_claim_function(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url)
    tables = make_tables(f"{prefix}_")
    count = text("SELECT count(*) FROM pg_proc WHERE proname = :name")
    name = {"name": f"{prefix}_claim_limited"}
    try:
        await SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_").migrate()
        async with engine.begin() as conn:
            assert await conn.scalar(count, name) == 1
            await conn.run_sync(lambda c: command.downgrade(config_for(c, tables), "0006"))
            assert await conn.scalar(count, name) == 0
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def test_a_rate_window_of_revision_0005_holds_after_the_upgrade_and_back(
    engine: AsyncEngine, prefix: str
) -> None:
    # 0006 keeps a type's newest step in columns of its own (0005: the last entry of
    # recent_starts). Starts recorded either way count after the upgrade and after a
    # downgrade.
    tables = make_tables(f"{prefix}_")
    controls = tables.type_controls
    now = time.time()
    window = [[now - 10, 2], [now - 1, 1]]
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: command.upgrade(config_for(c, tables), "0005"))
        await conn.execute(
            insert(controls).values(
                type_name="t", paused=False, rate=4, per_seconds=60.0, recent_starts=window
            )
        )
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    for _ in range(3):
        await _start(state)
    assert len(await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=5)) == 1
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: command.downgrade(config_for(c, tables), "0005"))
        stored = await conn.scalar(select(controls.c.recent_starts))
    assert stored[:2] == window
    assert sum(starts for _, starts in stored) == 4


async def test_sqlite_tables_of_0010_are_rebuilt_with_text_json_columns_that_keep_every_value(
    tmp_path: Path, prefix: str
) -> None:
    # Before 0011 the JSON columns were declared JSON (NUMERIC affinity): SQLite kept a
    # bare number as a REAL or an INTEGER. 0011's downgrade declares them so again.
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    tables = make_tables(f"{prefix}_")
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    numbers = [3.5058147284938744e-295, 0.1 + 0.2, 1.7976931348623157e308, 1.0, -0.0, 2**63 - 1]
    try:
        await state.migrate()
        async with engine.connect() as conn:
            migrated = await conn.run_sync(_shape, tables)
        async with engine.begin() as conn:
            await conn.run_sync(lambda c: command.downgrade(config_for(c, tables), "0010"))
        ids = [(await _start(state, n)).id for n in numbers]
        nested = (await _start(state, {"n": numbers})).id
        before = [(await state.get_job(i)).input for i in ids]
        assert sorted(await _stored_types(engine, tables)) == ["integer"] * 3 + ["real"] * 3

        await state.migrate()
        after = [(await state.get_job(i)).input for i in ids]
        assert [repr(n) for n in after] == [repr(n) for n in before]
        assert (await state.get_job(nested)).input == {"n": numbers}
        assert set(await _stored_types(engine, tables)) == {"text"}
        async with engine.connect() as conn:
            assert await conn.run_sync(_shape, tables) == migrated
        again = [(await state.get_job((await _start(state, n)).id)).input for n in numbers]
        assert [repr(n) for n in again] == [repr(n) for n in numbers]
    finally:
        await engine.dispose()


async def test_sqlite_tables_made_from_make_metadata_before_0011_are_adopted_and_rebuilt(
    tmp_path: Path, prefix: str
) -> None:
    # make_metadata declared the JSON columns JSON on SQLite before 0011.
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    before_0011 = make_tables(f"{prefix}_", timestamp=ddl_timestamp, json=JSON).metadata
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    try:
        async with engine.begin() as conn:
            await conn.run_sync(before_0011.create_all)
        started = await _start(state, 3.5058147284938744e-295)
        stored = (await state.get_job(started.id)).input

        await state.migrate(adopt=True)
        assert repr((await state.get_job(started.id)).input) == repr(stored)
        async with engine.connect() as conn:
            declared = await conn.run_sync(_declared_json_types, state.tables)
        assert declared == {"TEXT"}
    finally:
        await engine.dispose()


def _declared_json_types(sync_conn: Any, tables: Any) -> set[str]:
    db = inspect(sync_conn)
    return {
        str(column["type"])
        for table in tables.metadata.sorted_tables
        for column in db.get_columns(table.name)
        if isinstance(table.c[column["name"]].type, JsonDocument)
    }


def _shape(sync_conn: Any, tables: Any) -> dict[str, Any]:
    """Each queue table's columns, keys and indexes (partial ones' predicates included)."""
    db = inspect(sync_conn)
    shape: dict[str, Any] = {}
    for table in tables.metadata.sorted_tables:
        indexes = db.get_indexes(table.name)
        for index in indexes:
            index["dialect_options"] = {k: str(v) for k, v in index["dialect_options"].items()}
        columns = db.get_columns(table.name)
        shape[table.name] = (
            [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in columns],
            db.get_pk_constraint(table.name),
            db.get_unique_constraints(table.name),
            sorted(indexes, key=lambda index: str(index["name"])),
        )
    return shape


async def _stored_types(engine: AsyncEngine, tables: Any) -> list[str]:
    """SQLite's storage class of each job's input whose document is not an object."""
    jobs = tables.jobs
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(func.typeof(jobs.c.input)).where(func.json_type(jobs.c.input) != "object")
        )
        return list(rows.scalars())


def _notes() -> Any:
    from state_adapters.notifications import NotificationBuffer

    return NotificationBuffer()


async def _start(state: SqlAlchemyStateAdapter, input: Any = None) -> Any:
    from state_adapters.model import NewChain, NewJob
    from state_adapters.notifications import NotificationBuffer

    (started,) = await state.start_chains(
        [NewChain(NewJob("t", input))], notes=NotificationBuffer()
    )
    return started
