"""A plain start (no ``session=``) keeps its connection for a start right after it:
starts one after another in a task take one connection out of the pool between them,
and the connection is back in the pool once the event loop turns without a start on
it. Each start still commits before it returns; a start that fails, is cancelled or
finds its connection killed leaves nothing held. On each async driver (psycopg 3,
asyncpg), against the test Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from queuert_notify.client.client import Client
from queuert_notify.errors import InvalidInputError
from queuert_notify.notify.noop import NoopNotifyAdapter
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.conftest import ASYNC_POSTGRES_DRIVERS, with_driver
from tests.support.pool_checks import cancelled_at_every_await, count_checkouts
from tests.support.queue_helpers import drop_tables, wait_until
from tests.test_postgres_notify import libpq_dsn

pytest_plugins = ["tests.support.queue_fixtures"]  # ``state`` on the engine below


def _named(url: str, name: str, **options: Any) -> AsyncEngine:
    """An engine on ``url`` whose sessions carry ``name`` as their application_name, so
    the test sees (and kills) only its own backends."""
    connect_args: dict[str, Any] = (
        {"server_settings": {"application_name": name}}
        if url.startswith("postgresql+asyncpg")
        else {"application_name": name}
    )
    return create_async_engine(url, connect_args=connect_args, **options)


@pytest.fixture
async def engine(async_postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    """A pool of two and no overflow, so checkouts can be counted."""
    engine = _named(async_postgres_url, prefix, pool_size=2, max_overflow=0)
    try:
        yield engine
    finally:
        await engine.dispose()  # a killed backend's connection may still be pooled
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.fixture
async def client(state: SqlAlchemyStateAdapter) -> AsyncIterator[Client]:
    async with Client(state=state, notify=NoopNotifyAdapter()) as client:
        await _loop_idle(state.engine)
        yield client


def _checked_out(engine: AsyncEngine) -> int:
    return int(engine.sync_engine.pool.checkedout())  # type: ignore[attr-defined]


async def _loop_idle(engine: AsyncEngine) -> None:
    """Until the loop has turned with no start running and the connection a start kept
    is back in the pool (the return runs in a task of its own)."""
    await wait_until(lambda: _checked_out(engine) == 0)


async def _jobs(state: SqlAlchemyStateAdapter) -> int:
    async with state.engine.connect() as conn:
        counted = await conn.execute(select(func.count()).select_from(state.tables.jobs))
        return int(counted.scalar_one())


def _jobs_seen_by_another_connection(postgres_url: str, prefix: str) -> int:
    """The jobs committed, counted on a connection of another client (plain psycopg)."""
    with psycopg.connect(libpq_dsn(postgres_url)) as other:
        (count,) = other.execute(f"SELECT count(*) FROM {prefix}_jobs").fetchone() or (0,)
    return int(count)


def _unpooled(postgres_url: str, driver: str, prefix: str) -> AsyncEngine:
    """An engine without a pool (as SQLAlchemy advises for one used from several event
    loops), for a test that runs loops of its own."""
    return _named(with_driver(postgres_url, driver), prefix, poolclass=NullPool)


def _drop_tables_from_a_new_loop(postgres_url: str, driver: str, prefix: str) -> None:
    async def drop() -> None:
        engine = create_async_engine(with_driver(postgres_url, driver), poolclass=NullPool)
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()

    asyncio.run(drop())


async def test_starts_back_to_back_take_one_connection_and_give_it_back_when_the_loop_idles(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, client: Client
) -> None:
    checkouts = count_checkouts(engine)
    for _ in range(20):
        await client.start_chain("t")
        assert _checked_out(engine) == 1  # kept for the next start
    assert checkouts[0] == 1
    await _loop_idle(engine)
    assert await _jobs(state) == 20  # each committed on its own
    # The next burst takes one connection again.
    checkouts[0] = 0
    for _ in range(3):
        await client.start_chain("t")
    assert checkouts[0] == 1


async def test_a_start_commits_before_it_returns(
    engine: AsyncEngine, postgres_url: str, client: Client, prefix: str
) -> None:
    await client.start_chain("t")
    # Read at once (the loop has not turned: the connection is still kept).
    assert _jobs_seen_by_another_connection(postgres_url, prefix) == 1
    assert _checked_out(engine) == 1


async def test_concurrent_starts_all_succeed_and_keep_at_most_one_connection(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, client: Client
) -> None:
    async def starts(n: int) -> None:
        for _ in range(n):
            await client.start_chain("t")

    await asyncio.gather(*(starts(5) for _ in range(8)))
    await _loop_idle(engine)
    assert await _jobs(state) == 40


async def test_with_no_connection_left_in_the_pool_a_start_gives_its_own_back_at_once(
    async_postgres_url: str, prefix: str
) -> None:
    # A pool of one: a checkout of the application's could be waiting for it.
    engine = _named(async_postgres_url, prefix, pool_size=1, max_overflow=0, pool_timeout=30)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    try:
        await state.migrate()
        client = Client(state=state, notify=NoopNotifyAdapter())
        for _ in range(3):
            await client.start_chain("t")
            assert _checked_out(engine) == 0
            async with engine.begin() as conn:
                await client.start_chain("t", session=conn)
        assert await _jobs(state) == 6
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def test_a_task_waiting_on_the_pool_gets_a_connection_during_a_run_of_starts(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, client: Client
) -> None:
    # The pool's two connections: one held by the application, one the starts' own.
    started = 0
    first_done = asyncio.Event()
    waited_for: list[int] = []

    async def starts() -> None:
        nonlocal started
        for _ in range(30):
            await client.start_chain("t")
            started += 1
            first_done.set()

    async def checkout_while_they_run() -> None:
        await first_done.wait()
        async with engine.connect():
            waited_for.append(started)

    async with engine.connect():
        await asyncio.gather(starts(), checkout_while_they_run())
    # It got the starts' connection when one of them gave it back, not after the 30.
    assert waited_for and waited_for[0] < 30
    assert await _jobs(state) == 30


@pytest.mark.parametrize("driver", ASYNC_POSTGRES_DRIVERS)
def test_a_start_on_another_event_loop_never_takes_the_connection_one_loop_keeps(
    postgres_url: str, driver: str, prefix: str
) -> None:
    # One engine, two loops in two threads.
    engine = _unpooled(postgres_url, driver, prefix)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    kept, go_on = threading.Event(), threading.Event()

    async def first_loop() -> None:
        await state.migrate()
        await Client(state=state, notify=NoopNotifyAdapter()).start_chain("t")
        kept.set()  # the start's connection is kept: this loop has not turned since
        go_on.wait(60)  # and does not, while the other loop starts a chain

    async def second_loop() -> None:
        await Client(state=state, notify=NoopNotifyAdapter()).start_chain("t")

    thread = threading.Thread(target=asyncio.run, args=(first_loop(),))
    thread.start()
    try:
        assert kept.wait(60)
        checkouts = count_checkouts(engine)
        asyncio.run(second_loop())
        assert checkouts[0] == 1  # a connection of its own, not the other loop's
    finally:
        go_on.set()
        thread.join(60)
    try:
        assert _jobs_seen_by_another_connection(postgres_url, prefix) == 2
    finally:
        _drop_tables_from_a_new_loop(postgres_url, driver, prefix)


async def test_a_start_with_bad_input_writes_nothing_and_keeps_nothing(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, client: Client
) -> None:
    await client.start_chain("t")
    with pytest.raises(InvalidInputError):
        await client.start_chain("t", priority="high")  # type: ignore[arg-type]
    await _loop_idle(engine)
    assert await _jobs(state) == 1


async def test_a_start_the_server_refuses_gives_its_connection_back_at_once(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter, client: Client
) -> None:
    (first,) = await state.start_chains([NewChain(NewJob("t"))], notes=NotificationBuffer())
    assert _checked_out(engine) == 1
    # The same chain id again: a primary key violation, on the connection kept.
    with pytest.raises(IntegrityError):
        await state.start_chains([NewChain(NewJob("t"), id=first.id)], notes=NotificationBuffer())
    assert _checked_out(engine) == 0
    await client.start_chain("t")
    assert await _jobs(state) == 2


@pytest.mark.parametrize("driver", ASYNC_POSTGRES_DRIVERS)
async def test_a_start_cancelled_at_any_await_leaves_no_connection_in_a_bad_state(
    postgres_url: str, driver: str, prefix: str
) -> None:
    # One connection: every start after a cancelled one runs on the connection it left.
    engine = _named(with_driver(postgres_url, driver), prefix, pool_size=1, max_overflow=0)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    try:
        await state.migrate()
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:

            async def two_starts() -> None:
                await client.start_chain("t")
                await client.start_chain("t")  # on the connection the first one kept

            for cancels_after in range(16):
                await cancelled_at_every_await(two_starts, after=cancels_after)
                await _loop_idle(engine)
                async with asyncio.timeout(10):
                    await client.start_chain("t")
                    await client.start_chain("t")
            await _loop_idle(engine)
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def test_a_backend_killed_between_starts_costs_the_next_start_a_retry(
    engine: AsyncEngine,
    state: SqlAlchemyStateAdapter,
    client: Client,
    postgres_url: str,
    prefix: str,
) -> None:
    await client.start_chain("t")
    checkouts = count_checkouts(engine)
    # Killed from a blocking connection: the event loop does not turn, the connection
    # stays kept, and its backend is gone before the next start.
    _kill_backends(postgres_url, prefix)
    assert _checked_out(engine) == 1
    await client.start_chain("t")  # fails on the dead connection, then is repeated
    assert checkouts[0] >= 1  # the dead connection was not kept: others were taken
    await _loop_idle(engine)
    assert await _jobs(state) == 2


def _kill_backends(postgres_url: str, name: str) -> None:
    """Terminate the sessions of application_name ``name`` and wait until they are gone."""
    with psycopg.connect(libpq_dsn(postgres_url), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        )
        deadline = time.monotonic() + 30
        while _backends(admin, name) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _backends(admin, name)


def _backends(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()
    return int(row[0]) if row else 0


async def test_closing_the_client_gives_the_kept_connection_back(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    async with Client(state=state, notify=NoopNotifyAdapter()) as client:
        await client.start_chain("t")
        assert _checked_out(engine) == 1
    assert _checked_out(engine) == 0
    client = Client(state=state, notify=NoopNotifyAdapter())
    await client.start_chain("t")
    await client.close()
    assert _checked_out(engine) == 0


async def test_a_start_right_before_the_engine_is_disposed_leaves_no_connection_open(
    async_postgres_url: str, postgres_url: str, prefix: str
) -> None:
    engine = _named(async_postgres_url, prefix)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    try:
        await state.migrate()
        await Client(state=state, notify=NoopNotifyAdapter()).start_chain("t")
        await engine.dispose()  # the connection kept is still out of the pool
        with psycopg.connect(libpq_dsn(postgres_url), autocommit=True) as admin:
            await wait_until(lambda: _backends(admin, prefix) == 0)
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.mark.parametrize("driver", ASYNC_POSTGRES_DRIVERS)
def test_a_start_last_in_asyncio_run_still_gives_its_connection_back(
    postgres_url: str, driver: str, prefix: str
) -> None:
    # No pool: a connection given back is closed, not left to a loop that is gone.
    engine = _unpooled(postgres_url, driver, prefix)
    moves = {"checkout": 0, "checkin": 0}

    def counter(name: str) -> Callable[..., None]:
        return lambda *_: moves.update({name: moves[name] + 1})

    for name in moves:
        event.listen(engine.sync_engine, name, counter(name))

    async def main() -> None:
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await state.migrate()
        await Client(state=state, notify=NoopNotifyAdapter()).start_chain("t")
        # asyncio.run now cancels the tasks left, the connection's return included.

    try:
        asyncio.run(main())
        assert moves["checkin"] == moves["checkout"]
        with psycopg.connect(libpq_dsn(postgres_url), autocommit=True) as admin:
            assert _backends(admin, prefix) == 0
    finally:
        _drop_tables_from_a_new_loop(postgres_url, driver, prefix)
