"""Client writes repeated after a connection lost around COMMIT: the server committed
(or not), the client saw the connection drop, and the repeat must neither do the change
twice nor report a failure for a change that was made.

The fault is real on both sides: :class:`LostCommit` lets the server commit (or not) and
closes the driver connection under SQLAlchemy, whose own call then fails as on a dropped
connection; SQLAlchemy invalidates it and the client repeats the call. :class:`LateCommit`
commits the lost transaction only after the repeat has looked for it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from itertools import product
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, event, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from queuert_notify import NoopNotifyAdapter
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.testing import Recorder
from state_adapters.ids import new_id
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.queue_helpers import CountingState, wait_until
from tests.test_postgres_notify import libpq_dsn

pytest_plugins = ["tests.support.queue_fixtures"]

# LostCommit closes the driver connection under SQLAlchemy the way psycopg and sqlite3
# report a lost connection; it does not yet imitate asyncpg's reports.
both_databases = pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
on_postgres = pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)


class LostCommit:
    """Break the connection of the next write that commits on ``engine``.

    With ``committed`` the server commits first and the reply is what gets lost: the
    COMMIT's, or on Postgres, where a one-statement write runs in autocommit, the
    statement's. Without, nothing reaches the server's commit: the transaction dies
    with the connection at COMMIT, or the autocommit statement is never sent. Either
    way the driver connection is closed under SQLAlchemy, which reports a lost
    connection (``connection_invalidated``). ``fired`` counts the writes broken.

    On SQLite the adapter commits its own plain starts on the sqlite3 connection itself,
    in the aiosqlite thread (``state_adapters/sqlite/driver.py``), past SQLAlchemy's
    ``commit`` event: the connection under aiosqlite is wrapped so that its ``COMMIT``
    is broken there.
    """

    def __init__(self, engine: AsyncEngine, *, committed: bool) -> None:
        self.engine = engine
        self.committed = committed
        self.fired = 0
        self._active = False

    async def __aenter__(self) -> LostCommit:
        if self.engine.dialect.name == "sqlite":
            # A start keeps its connection for the next one until the loop turns: wait
            # for it to be back, so that the next write's connection is checked out.
            await wait_until(lambda: self.engine.sync_engine.pool.checkedout() == 0)  # type: ignore[attr-defined]
        self._active = True
        event.listen(self.engine.sync_engine, "commit", self._on_commit)
        event.listen(self.engine.sync_engine, "before_cursor_execute", self._before_statement)
        event.listen(self.engine.sync_engine, "after_cursor_execute", self._after_statement)
        event.listen(self.engine.sync_engine, "checkout", self._on_checkout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._active = False
        event.remove(self.engine.sync_engine, "commit", self._on_commit)
        event.remove(self.engine.sync_engine, "before_cursor_execute", self._before_statement)
        event.remove(self.engine.sync_engine, "after_cursor_execute", self._after_statement)
        event.remove(self.engine.sync_engine, "checkout", self._on_checkout)

    def _on_checkout(self, dbapi_connection: Any, *args: Any) -> None:
        driver = dbapi_connection.driver_connection
        if self.engine.dialect.name == "sqlite" and not isinstance(driver._connection, _Lossy):
            driver._connection = _Lossy(driver._connection, self)

    def breaks_driver_commit(self) -> bool:
        """Whether the next ``COMMIT`` sent to the sqlite3 connection is to be broken."""
        if not self._active or self.fired:
            return False
        self.fired += 1
        return True

    def _on_commit(self, connection: Connection) -> None:
        if self.fired or _autocommit(connection):
            return  # an autocommit statement is broken around the statement itself
        self.fired += 1
        raw: Any = connection.connection.dbapi_connection
        if self.committed:
            raw.commit()
        if self.engine.dialect.name == "sqlite":
            # aiosqlite's adapter skips commit() on a closed aiosqlite connection, so
            # close the sqlite3 handle under it (in its own thread): the commit then
            # fails with "Cannot operate on a closed database", a disconnect.
            inner = raw.driver_connection
            await_only(inner._execute(inner._conn.close))
        else:
            raw.close()

    def _before_statement(self, connection: Connection, *args: Any) -> None:
        if not self.committed:
            self._break_write(connection, args[1])

    def _after_statement(self, connection: Connection, *args: Any) -> None:
        # The adapter runs its statements on the driver connection and calls this once
        # the driver returned (state_adapters/drivers): the write is committed then.
        if self.committed:
            self._break_write(connection, args[1])

    def _break_write(self, connection: Connection, statement: str) -> None:
        """Close the connection of an autocommit write as if it was lost, and fail it."""
        if self.fired or not _autocommit(connection):
            return
        if statement.lstrip().upper().startswith("SELECT"):
            return
        self.fired += 1
        connection.connection.dbapi_connection.close()  # type: ignore[union-attr]
        raise self.engine.dialect.loaded_dbapi.OperationalError(
            "server closed the connection unexpectedly"
        )


class _Lossy:
    """A sqlite3 connection whose ``COMMIT`` :class:`LostCommit` breaks: committed or
    not, the connection is then closed, and the ``COMMIT`` fails with "Cannot operate on
    a closed database", a disconnect. Everything else goes to the connection itself."""

    def __init__(self, connection: sqlite3.Connection, fault: LostCommit) -> None:
        object.__setattr__(self, "_real", connection)
        object.__setattr__(self, "_fault", fault)

    def execute(self, statement: str, *args: Any) -> sqlite3.Cursor:
        if statement.strip().upper() == "COMMIT" and self._fault.breaks_driver_commit():
            if self._fault.committed:
                self._real.execute(statement)
            self._real.close()
        return self._real.execute(statement, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real, name, value)


def _autocommit(connection: Connection) -> bool:
    return connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


class LateCommit:
    """Postgres: on the next commit, take the open transaction away from SQLAlchemy
    (which sees its connection closed) and commit it ``after`` seconds later, as a
    COMMIT that a proxy delivered after the client had given up on the connection."""

    def __init__(self, closed: psycopg.AsyncConnection[Any], after: float) -> None:
        self.closed = closed
        self.after = after
        self.fired = 0
        self.task: asyncio.Task[None] | None = None

    def __call__(self, connection: Connection) -> None:
        if self.fired:
            return
        self.fired += 1
        raw: Any = connection.connection.dbapi_connection
        stolen, raw._connection = raw._connection, self.closed
        self.task = asyncio.get_running_loop().create_task(self._commit_later(stolen))

    async def _commit_later(self, stolen: psycopg.AsyncConnection[Any]) -> None:
        await asyncio.sleep(self.after)
        await stolen.commit()
        await stolen.close()


@asynccontextmanager
async def late_commit(engine: AsyncEngine, hook: LateCommit) -> AsyncIterator[LateCommit]:
    event.listen(engine.sync_engine, "commit", hook)
    try:
        yield hook
    finally:
        event.remove(engine.sync_engine, "commit", hook)


async def stored_chain_ids(state: SqlAlchemyStateAdapter) -> list[str]:
    """Every chain id in the tables, and every first job's id (they must agree)."""
    chains, jobs = state.tables.chains, state.tables.jobs
    async with state.engine.connect() as conn:
        chain_ids = sorted((await conn.execute(select(chains.c.id))).scalars())
        first_jobs = sorted(
            (await conn.execute(select(jobs.c.id).where(jobs.c.chain_index == 0))).scalars()
        )
    assert chain_ids == first_jobs
    return chain_ids


async def listen_scheduled(client: Client, type_name: str) -> Recorder:
    recorder = Recorder()
    await client.notify.listen_job_scheduled([type_name], recorder)
    return recorder


# -- starting chains -----------------------------------------------------------------


@both_databases
async def test_a_lost_start_leaves_all_or_none_of_its_chains(
    state: SqlAlchemyStateAdapter, engine: AsyncEngine
) -> None:
    """One transaction writes every chain of a batch: after a lost commit either all of
    them are stored or none is, which is what lets a repeat tell by one read."""
    for committed, dedup_key in product((False, True), (None, "k")):
        # Without a dedup key a Postgres start is one autocommit statement.
        chains = [NewChain(NewJob("t", {"n": n}), id=new_id()) for n in range(5)]
        chains.append(NewChain(NewJob("t"), id=new_id(), dedup_key=dedup_key and f"{committed}"))
        async with LostCommit(engine, committed=committed) as fault:
            with pytest.raises(DBAPIError) as lost:
                await state.start_chains(chains, notes=NotificationBuffer())
        assert lost.value.connection_invalidated and fault.fired == 1
        found = await state.get_chains([str(c.id) for c in chains])
        assert [c.id for c in found] == ([c.id for c in chains] if committed else [])


@both_databases
@pytest.mark.parametrize("committed", [True, False], ids=["commit-succeeded", "commit-lost"])
@pytest.mark.parametrize("batch", [1, 20])
async def test_a_start_repeated_after_a_lost_commit_creates_each_chain_once(
    client: Client, state: SqlAlchemyStateAdapter, engine: AsyncEngine, committed: bool, batch: int
) -> None:
    scheduled = await listen_scheduled(client, "t")
    async with LostCommit(engine, committed=committed) as fault:
        started = await client.start_chains([ChainSpec("t", {"n": n}) for n in range(batch)])
    assert fault.fired == 1, "the commit was not broken: the test proves nothing"
    assert [s.deduplicated for s in started] == [False] * batch
    assert await stored_chain_ids(state) == sorted(s.id for s in started)
    assert [(await client.get_job(s.id)).input for s in started] == [{"n": n} for n in range(batch)]
    # The wakeup is not lost with the connection: workers hear of the new jobs.
    await scheduled.wait_for(1, within=5)


@both_databases
async def test_a_mixed_batch_repeated_after_a_lost_commit_answers_as_the_lost_attempt(
    client: Client, state: SqlAlchemyStateAdapter, engine: AsyncEngine
) -> None:
    """The lost attempt created A, B and D and deduplicated C onto A (same key) and E
    onto an existing chain: the repeat returns exactly that, creating nothing more."""
    blocker = await client.start_chain("blocker")
    existing = await client.start_chain("t", dedup_key="old")
    specs = [
        ChainSpec("t", {"n": "a"}, dedup_key="k"),
        ChainSpec("t", {"n": "b"}),
        ChainSpec("t", {"n": "c"}, dedup_key="k"),
        ChainSpec("t", {"n": "d"}, blockers=[blocker.id]),
        ChainSpec("t", {"n": "e"}, dedup_key="old"),
    ]
    async with LostCommit(engine, committed=True) as fault:
        a, b, c, d, e = await client.start_chains(specs)
    assert fault.fired == 1
    assert (c.id, c.deduplicated) == (a.id, True)
    assert (e.id, e.deduplicated) == (existing.id, True)
    assert not any(s.deduplicated for s in (a, b, d))
    assert await stored_chain_ids(state) == sorted([blocker.id, existing.id, a.id, b.id, d.id])
    assert (await client.get_chain(d.id)).status == "blocked"


@both_databases
async def test_a_deduplicated_start_repeated_after_a_lost_commit_returns_the_existing_chain(
    client: Client, state: SqlAlchemyStateAdapter, engine: AsyncEngine
) -> None:
    existing = await client.start_chain("t", dedup_key="k")
    async with LostCommit(engine, committed=True) as fault:
        again = await client.start_chain("t", dedup_key="k")
    assert fault.fired == 1
    assert (again.id, again.deduplicated) == (existing.id, True)
    assert await stored_chain_ids(state) == [existing.id]


@on_postgres
async def test_a_commit_that_lands_after_the_repeat_read_it_still_yields_one_chain(
    client: Client, state: SqlAlchemyStateAdapter, engine: AsyncEngine, postgres_url: str
) -> None:
    """The lost attempt's COMMIT reaches the server only after the repeat found nothing:
    the repeat's insert waits for it, hits the ids it made, and reads again."""
    blocker = await client.start_chain("blocker")  # blockers: the start is a transaction
    closed = await psycopg.AsyncConnection.connect(libpq_dsn(postgres_url))
    await closed.close()
    async with late_commit(engine, LateCommit(closed, after=0.5)) as fault:
        started = await client.start_chains(
            [ChainSpec("t", {"n": n}, blockers=[blocker.id]) for n in range(3)]
        )
    assert fault.fired == 1 and fault.task is not None and fault.task.done()
    await fault.task
    assert [s.deduplicated for s in started] == [False] * 3
    assert await stored_chain_ids(state) == sorted([blocker.id, *(s.id for s in started)])


@both_databases
async def test_a_start_that_loses_no_connection_reads_nothing_back(
    state: SqlAlchemyStateAdapter,
) -> None:
    counting = CountingState(state)
    async with Client(state=counting, notify=NoopNotifyAdapter()) as client:
        await client.start_chains([ChainSpec("t"), ChainSpec("t", dedup_key="k")])
        await client.start_chain("t")
        assert counting.calls == {"start_chains": 2}


# -- acting on chains ----------------------------------------------------------------


@both_databases
async def test_cancel_repeated_after_a_lost_commit_returns_the_cancelled_chain(
    client: Client, engine: AsyncEngine
) -> None:
    chain = await client.start_chain("t")
    ended = Recorder()
    await client.notify.listen_chain_completed(chain.id, ended)
    async with LostCommit(engine, committed=True) as fault:
        cancelled = await client.cancel_chain(chain.id)
    assert fault.fired == 1
    assert cancelled.status == "cancelled"
    assert (await client.get_chain(chain.id)).status == "cancelled"
    await ended.wait_for(1, within=5)  # announced by the repeat


@both_databases
async def test_complete_chain_repeated_after_a_lost_commit_returns_the_stored_output(
    client: Client, engine: AsyncEngine
) -> None:
    chain = await client.start_chain("t")
    ended = Recorder()
    await client.notify.listen_chain_completed(chain.id, ended)
    async with LostCommit(engine, committed=True) as fault:
        done = await client.complete_chain(chain.id, {"approved": True})
    assert fault.fired == 1
    assert (done.status, done.output) == ("completed", {"approved": True})
    assert (await client.list_jobs(chain_id=chain.id)).items[0].status == "completed"
    await ended.wait_for(1, within=5)


@both_databases
async def test_trigger_repeated_after_a_lost_commit_makes_the_job_due_once(
    client: Client, engine: AsyncEngine
) -> None:
    chain = await client.start_chain("t", delay=3600)
    scheduled = await listen_scheduled(client, "t")
    async with LostCommit(engine, committed=True) as fault:
        triggered = await client.trigger_chain(chain.id)
    assert fault.fired == 1
    assert triggered.status == "pending"
    assert triggered.last_job.scheduled_at <= datetime.now(UTC)
    await scheduled.wait_for(1, within=5)


@both_databases
@pytest.mark.parametrize("committed", [True, False], ids=["commit-succeeded", "commit-lost"])
async def test_delete_chain_repeated_after_a_lost_commit_succeeds_and_the_chain_is_gone(
    client: Client, state: SqlAlchemyStateAdapter, engine: AsyncEngine, committed: bool
) -> None:
    chain = await client.start_chain("t")
    keep = await client.start_chain("t")
    async with LostCommit(engine, committed=committed) as fault:
        await client.delete_chain(chain.id)  # no ChainNotFoundError from the repeat
    assert fault.fired == 1
    assert await stored_chain_ids(state) == [keep.id]
    async with state.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(state.tables.jobs)) == 1
