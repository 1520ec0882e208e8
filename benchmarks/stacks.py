"""The system under test: one state backend with one notify adapter, on fresh tables.

A :class:`Stack` is opened per round, so rounds never see each other's rows,
and is dropped afterwards (only its own tables / keys / SQLite file).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import MetaData, event, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks import runner, services
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter

STATE_KINDS = ("postgres", "sqlite")
NOTIFY_KINDS = ("noop", "in-process", "redis", "redis-lists", "postgres", "nats")
DEFAULT_NOTIFY_KINDS = ("noop", "in-process", "redis")
SHARED_NOTIFY_KINDS = ("noop", "in-process", "postgres")
"""Adapters every node of a stack shares: in-memory ones reach only their own
instance, and a Postgres NOTIFY adapter holds two server connections (32 of
them would exhaust a shared server's max_connections); its messages still
travel through the server."""

_STATE_LABELS = {"postgres": "Postgres", "sqlite": "SQLite"}
_NOTIFY_LABELS = {
    "noop": "noop",
    "in-process": "in-process",
    "redis": "Redis",
    "redis-lists": "Redis lists",
    "postgres": "Postgres NOTIFY",
    "nats": "NATS",
}


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--state``, ``--notify`` (comma-separated lists) and the service URLs."""
    parser.add_argument(
        "--state", default=",".join(STATE_KINDS), help=f"comma-separated: {', '.join(STATE_KINDS)}"
    )
    parser.add_argument(
        "--notify",
        default=",".join(DEFAULT_NOTIFY_KINDS),
        help=f"comma-separated: {', '.join(NOTIFY_KINDS)}",
    )
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--nats-url", default=services.nats_url())


def combinations(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Every (state kind, notify kind) the arguments ask for, state-major."""
    states = runner.choices(args.state, STATE_KINDS, "--state")
    notifies = runner.choices(args.notify, NOTIFY_KINDS, "--notify")
    return [(state, notify) for state in states for notify in notifies]


async def server_notes(args: argparse.Namespace) -> str:
    """Versions of the servers the chosen combinations use, for the report's notes."""
    combos = combinations(args)
    notes = []
    if any(state == "postgres" or notify == "postgres" for state, notify in combos):
        notes.append(f"Postgres {await services.postgres_server_version(args.postgres_url)}")
    if any(state == "sqlite" for state, _ in combos):
        notes.append(f"SQLite {sqlite3.sqlite_version} (WAL)")
    if any(notify in ("redis", "redis-lists") for _, notify in combos):
        notes.append(f"Redis {await services.redis_server_version(args.redis_url)}")
    if any(notify == "nats" for _, notify in combos):
        notes.append(f"NATS {await services.nats_server_version(args.nats_url)}")
    return ", ".join(notes) + " on the same host"


def label(state_kind: str, notify_kind: str) -> str:
    """``Postgres + Redis``: how a combination is named in tables."""
    return f"{_STATE_LABELS[state_kind]} + {_NOTIFY_LABELS[notify_kind]}"


class Completions:
    """A worker's ``on_event`` counting completed runs: :attr:`done` is set at the
    ``total``-th, when :attr:`last` and :attr:`cpu_last` take ``time.perf_counter()``
    and ``time.process_time()`` (the end of a timed drain)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.completed = 0
        self.done = asyncio.Event()
        self.last = self.cpu_last = 0.0

    def __call__(self, event: WorkerEvent) -> None:
        if event.kind == "completed":
            self.completed += 1
            if self.completed == self.total:
                self.last, self.cpu_last = time.perf_counter(), time.process_time()
                self.done.set()


StatementPredicate = Callable[[str, Any], bool]
"""``(sql text, the parameters sent with it) -> counted?``"""


@dataclass
class StatementCounter:
    """Counts the SQL statements sent on an engine that a predicate selects."""

    matches: StatementPredicate
    count: int = 0

    def __call__(
        self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if self.matches(statement, parameters):
            self.count += 1


@dataclass
class Stack:
    """One state adapter (fresh tables) and the notify adapter kind under test.

    ``client`` is the producer's; :meth:`new_client` gives another node its own
    client, with a notify adapter of its own for Redis and NATS, so messages and
    wake budgets travel as they would between machines.
    """

    state_kind: str
    notify_kind: str
    engine: AsyncEngine
    state: Any
    client: Client
    args: argparse.Namespace
    prefix: str
    _exits: AsyncExitStack = field(repr=False, default_factory=AsyncExitStack)

    @property
    def label(self) -> str:
        return label(self.state_kind, self.notify_kind)

    async def new_client(self) -> Client:
        """A client for another node (a worker), closed with the stack."""
        if self.notify_kind in SHARED_NOTIFY_KINDS:
            return self.client
        client = Client(state=self.state, notify=_notify(self.notify_kind, self.args, self.prefix))
        return await self._exits.enter_async_context(client)

    async def analyze(self) -> None:
        """Refresh the planner statistics of this stack's tables, as autovacuum (Postgres)
        or a periodic ``ANALYZE`` (SQLite) would on a table that lives longer than a run."""
        async with self.engine.begin() as conn:
            if self.state_kind == "sqlite":
                await conn.execute(text("ANALYZE"))
                return
            names = await conn.run_sync(
                lambda sync: [
                    n for n in inspect(sync).get_table_names() if n.startswith(self.prefix)
                ]
            )
            for name in names:
                await conn.execute(text(f'ANALYZE "{name}"'))

    def count_statements(self, matches: StatementPredicate) -> StatementCounter:
        """Count statements on this stack's engine (and its execution-option views)
        for which ``matches(sql, parameters)`` is true. On SQLite the adapter's own
        transactions run on the sqlite3 connection itself, in the aiosqlite thread,
        past the engine's events (``state_adapters/sqlite/driver.py``): those are
        counted there, and handed to the counter on the event loop."""
        counter = StatementCounter(matches)
        sync_engine = self.engine.sync_engine
        event.listen(sync_engine, "before_cursor_execute", counter)
        if self.state_kind == "sqlite":

            def checkout(dbapi_connection: Any, *args: Any) -> None:
                driver = dbapi_connection.driver_connection
                if not isinstance(driver._connection, _CountedSqlite):
                    loop = asyncio.get_running_loop()
                    driver._connection = _CountedSqlite(driver._connection, counter, loop)

            event.listen(sync_engine, "checkout", checkout)
        return counter


class _CountedSqlite:
    """A sqlite3 connection whose ``execute`` calls are counted (on the event loop,
    before the aiosqlite call that made them returns); everything else is the
    connection's own."""

    def __init__(
        self, connection: Any, counter: StatementCounter, loop: asyncio.AbstractEventLoop
    ) -> None:
        object.__setattr__(self, "_real", connection)
        object.__setattr__(self, "_counted", (counter, loop))

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        counter, loop = self._counted
        loop.call_soon_threadsafe(counter, None, None, sql, parameters, None, False)
        return self._real.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real, name, value)


@asynccontextmanager
async def open_stack(
    state_kind: str, notify_kind: str, args: argparse.Namespace, *, pool_size: int = 12
) -> AsyncIterator[Stack]:
    """A migrated state adapter on tables of its own plus a connected client.

    Postgres connections are capped at ``pool_size`` (the server is shared: a
    benchmark must not starve other users of connections)."""
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    prefix = services.unique_prefix()
    async with AsyncExitStack() as exits:
        if state_kind == "sqlite":
            workdir = tempfile.mkdtemp(prefix="queuert-bench-")
            exits.callback(shutil.rmtree, workdir, True)
            engine = create_async_engine(f"sqlite+aiosqlite:///{workdir}/jobs.db")
        else:
            engine = create_async_engine(args.postgres_url, pool_size=pool_size, max_overflow=0)
        exits.push_async_callback(engine.dispose)
        table_prefix = f"{prefix}_"
        if state_kind == "postgres":
            exits.push_async_callback(_drop_tables, engine, table_prefix)
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        await state.migrate()
        if notify_kind in ("redis", "redis-lists"):
            exits.push_async_callback(services.delete_redis_prefix, args.redis_url, prefix)
        if notify_kind == "nats":
            from queuert_notify.notify.nats import default_bucket

            bucket = default_bucket(prefix)
            exits.push_async_callback(services.delete_nats_bucket, args.nats_url, bucket)
        client = await exits.enter_async_context(
            Client(state=state, notify=_notify(notify_kind, args, prefix))
        )
        stack = Stack(state_kind, notify_kind, engine, state, client, args, prefix)
        async with stack._exits:
            yield stack


def _notify(kind: str, args: argparse.Namespace, prefix: str) -> NotifyAdapter:
    if kind == "noop":
        return NoopNotifyAdapter()
    if kind == "in-process":
        return InProcessNotifyAdapter()
    if kind == "redis":
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        return RedisNotifyAdapter(url=args.redis_url, prefix=prefix)
    if kind == "redis-lists":
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        return RedisNotifyAdapter(url=args.redis_url, prefix=prefix, wake="lists")
    if kind == "postgres":
        from queuert_notify.notify.postgres import PostgresNotifyAdapter

        return PostgresNotifyAdapter(args.postgres_url, prefix=prefix)
    from queuert_notify.notify.nats import NatsNotifyAdapter

    return NatsNotifyAdapter(args.nats_url, prefix=prefix)


async def _drop_tables(engine: AsyncEngine, table_prefix: str) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(drop_prefixed, table_prefix)


def drop_prefixed(sync_conn: Any, table_prefix: str) -> None:
    """Drop only the tables that carry ``table_prefix`` (whichever the migrations
    made) and, on Postgres, the claim function of migration 0007."""
    metadata = MetaData()
    metadata.reflect(sync_conn, only=lambda name, _: name.startswith(table_prefix))
    metadata.drop_all(sync_conn)
    if sync_conn.dialect.name == "postgresql":
        sync_conn.exec_driver_sql(f'DROP FUNCTION IF EXISTS "{table_prefix}claim_limited"')
