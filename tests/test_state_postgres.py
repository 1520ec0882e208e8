"""Postgres specifics: one round trip per call where SQL allows, and settings errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify.errors import ConfigurationError
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion, ContinueWith, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.queue_helpers import drop_tables


@pytest.fixture
async def engine(postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(postgres_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.fixture
async def state(engine: AsyncEngine, prefix: str) -> SqlAlchemyStateAdapter:
    adapter = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await adapter.migrate()
    return adapter


class Trips:
    """Statements sent, and whether each ran outside an explicit transaction."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, bool]] = []

    @property
    def round_trips(self) -> int:
        # A statement inside a transaction also costs that transaction's BEGIN and
        # COMMIT; an autocommit statement is one round trip by itself.
        in_transaction = [s for s, autocommit in self.statements if not autocommit]
        autocommit = len(self.statements) - len(in_transaction)
        return autocommit + (len(in_transaction) + 2 if in_transaction else 0)


@contextmanager
def counting(engine: AsyncEngine) -> Iterator[Trips]:
    trips = Trips()

    def before(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        trips.statements.append((statement.split()[0], autocommit))

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        yield trips
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", before)


async def test_hot_path_calls_are_one_round_trip_each(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    notes = NotificationBuffer()
    with counting(engine) as trips:
        (started,) = await state.start_chains([NewChain(NewJob("t"))], notes=notes)
    assert trips.round_trips == 1
    with counting(engine) as trips:
        await state.start_chains([NewChain(NewJob("t")) for _ in range(51)], notes=notes)
    assert trips.round_trips == 1
    # The first claim also reads which types are paused or limited (then at most once
    # a second, see state_adapters.steps.type_controls); a claim is one round trip.
    await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=1)
    with counting(engine) as trips:
        jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=10)
    assert trips.round_trips == 1 and len(jobs) == 10
    job = jobs[0]
    assert job.lease_token is not None
    for call in (
        lambda: state.renew_lease(job.id, job.lease_token or "", 30),
        lambda: state.set_progress(job.id, job.lease_token or "", 0.5),
        lambda: state.next_due_at(["t"]),
        lambda: state.get_chain(started.id),
        lambda: state.get_job(job.id),
    ):
        with counting(engine) as trips:
            await call()
        assert trips.round_trips == 1


async def test_a_batch_writes_the_rows_a_start_of_one_chain_writes(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, prefix: str
) -> None:
    # The batch's statement reads a document of arrays; the single start binds each
    # column: the rows read the same. (A batch stores a None input as SQL NULL, as
    # its JSON records did before; a single start as JSON null: both read as None.)
    def chain(n: int, start: str) -> NewChain:
        job = NewJob(
            "t",
            None if n % 2 else {"n": None},
            priority=-n,
            max_attempts=None if n % 2 else n + 1,
            trace_context="tc" if n == 2 else None,
            concurrency_key="ck" if n % 2 else None,
        )
        return NewChain(job, dedup_key=None if n % 3 else f"{start}{n}")

    notes = NotificationBuffer()
    alone = [(await state.start_chains([chain(n, "a")], notes=notes))[0].id for n in range(4)]
    batch = [s.id for s in await state.start_chains([chain(n, "b") for n in range(4)], notes=notes)]
    columns = (
        "j.input IS NULL, j.input, j.status, j.priority, j.scheduled_at = j.created_at, "
        "j.max_attempts, substr(j.deduplication_key, 2), j.blockers_pending, j.chain_index, "
        "j.attempt, j.trace_context, j.concurrency_key, c.type_name, c.completed_at, "
        "c.has_dependents, substr(c.dedup_key, 2), c.created_at = j.created_at"
    )
    async with engine.connect() as conn:
        rows = {
            row[0]: tuple(row[1:])
            for row in await conn.execute(
                text(
                    f"SELECT j.id, {columns} FROM {prefix}_jobs j "
                    f"JOIN {prefix}_chains c ON c.id = j.chain_id"
                )
            )
        }
    assert [rows[i][1:] for i in batch] == [rows[i][1:] for i in alone]
    assert [rows[i][0] for i in batch] == [False, True, False, True]


async def test_completing_a_batch_costs_the_same_round_trips_as_one_job(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    notes = NotificationBuffer()
    await state.start_chains([NewChain(NewJob("t")) for _ in range(40)], notes=notes)
    one = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=1)
    many = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=39)

    def completions(jobs: Any) -> list[Completion]:
        return [Completion(j.id, j.lease_token, output=1) for j in jobs]

    with counting(engine) as single:
        await state.complete_jobs(completions(one), notes=notes)
    with counting(engine) as batch:
        await state.complete_jobs(completions(many[:20]), notes=notes)
    follow = ContinueWith(NewJob("next"))
    with counting(engine) as continued:
        await state.complete_jobs(
            [Completion(j.id, j.lease_token or "", continue_with=follow) for j in many[20:]],
            notes=notes,
        )
    # One autocommit statement completes the jobs, creates continuations and makes
    # chains final; nobody waits on these chains, so no unblocking statement follows.
    assert single.round_trips == batch.round_trips == continued.round_trips == 1
    assert (await state.count_jobs(type_names=["next"]))["pending"] == 19


async def test_completing_a_chain_with_dependents_unblocks_them_in_one_transaction(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    notes = NotificationBuffer()
    blocker, other = await state.start_chains(
        [NewChain(NewJob("t")), NewChain(NewJob("t"))], notes=notes
    )
    (dependent,) = await state.start_chains(
        [NewChain(NewJob("d"), blockers=[blocker.id])], notes=notes
    )
    jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=2)
    with counting(engine) as trips:
        results = await state.complete_jobs(
            [Completion(j.id, j.lease_token or "", output=1) for j in jobs], notes=notes
        )
    assert [r.status for r in results] == ["completed", "completed"]  # type: ignore[union-attr]
    # The one-statement attempt refuses (writing nothing), then the completion and
    # the unblocking run in one transaction.
    assert [s for s, _ in trips.statements] == ["WITH", "WITH", "UPDATE"]
    assert [autocommit for _, autocommit in trips.statements] == [True, False, False]
    assert (await state.get_chain(dependent.id)).status == "pending"
    assert (await state.get_chain(other.id)).status == "completed"
    # Nothing is noted twice for the refused attempt.
    assert notes.scheduled == {"t": 2, "d": 1}
    assert sorted(notes.completed_chains) == sorted([blocker.id, other.id])


def test_a_synchronous_engine_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="AsyncEngine"):
        SqlAlchemyStateAdapter(create_engine("sqlite://"))  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix_", ["", "1abc", "bad-prefix", "a" * 31, "drop table;"])
async def test_an_unsafe_table_prefix_is_refused(prefix_: str) -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(ConfigurationError, match="table_prefix"):
            SqlAlchemyStateAdapter(engine, table_prefix=prefix_)
    finally:
        await engine.dispose()


async def test_backoff_settings_are_checked() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(ConfigurationError, match="backoff"):
            SqlAlchemyStateAdapter(engine, backoff_base=10, backoff_cap=1)
    finally:
        await engine.dispose()


async def _kill_pooled_backend(engine: AsyncEngine, killer: AsyncEngine) -> None:
    """Terminate the server process behind the connection the pool holds."""
    async with engine.connect() as conn:
        pid = await conn.scalar(text("SELECT pg_backend_pid()"))
    async with killer.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


async def test_a_killed_idle_backend_is_replaced_with_pool_pre_ping(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url, pool_size=1, pool_pre_ping=True)
    killer = create_async_engine(postgres_url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await state.migrate()
        (started,) = await state.start_chains([NewChain(NewJob("t"))], notes=NotificationBuffer())
        await _kill_pooled_backend(engine, killer)
        assert (await state.get_chain(started.id)).status == "pending"
        await _kill_pooled_backend(engine, killer)
        assert len(await state.acquire(["t"], worker_id="w", lease_seconds=30)) == 1
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
        await killer.dispose()


async def test_without_pre_ping_one_call_fails_and_the_next_reconnects(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url, pool_size=1)
    killer = create_async_engine(postgres_url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await state.migrate()
        await _kill_pooled_backend(engine, killer)
        with pytest.raises(DBAPIError) as failure:
            await state.start_chains([NewChain(NewJob("t"))], notes=NotificationBuffer())
        assert failure.value.connection_invalidated
        await state.start_chains([NewChain(NewJob("t"))], notes=NotificationBuffer())
        assert (await state.count_jobs())["pending"] == 1
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
        await killer.dispose()
