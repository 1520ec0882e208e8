"""Helpers for client, worker and end-to-end tests (fixtures are in queue_fixtures)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import nats
import nats.js.errors
import pytest
from sqlalchemy import MetaData, inspect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify import (
    InProcessNotifyAdapter,
    NatsNotifyAdapter,
    NoopNotifyAdapter,
    PostgresNotifyAdapter,
    RedisNotifyAdapter,
)
from queuert_notify.notify.nats import default_bucket
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.notify.redis.adapter import WakeMode
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_helpers import delete_prefix

STATE_KINDS = ["sqlite", "postgres", "asyncpg"]
"""``postgres`` is psycopg 3; ``asyncpg`` is Postgres through asyncpg (and psycopg2 for a
sync engine: :func:`sync_url`). For tests of what the driver does -- the hot paths'
statements, the values they bind, the errors they translate -- as the state conformance
kit and tests/test_drivers.py do."""

DATABASES = ["sqlite", "postgres"]
"""SQLite and Postgres (psycopg 3): for tests of what lies above the driver seam (the
worker, the client's checks, retention, schedules, migrations, the CLI), which a third
driver would only repeat; asyncpg runs everything :data:`STATE_KINDS` runs."""


def sync_url(database_url: str) -> str:
    """The sync engine's URL on the database of a test's async ``database_url``: SQLite
    on its stdlib driver, Postgres on psycopg 3, or on psycopg2 where the async engine
    is asyncpg (so each accepted driver is exercised)."""
    return database_url.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg2")


NOTIFY_KINDS = [
    "noop",
    "in_process",
    "redis",
    "redis_lists",
    "postgres",
    "nats",
    "redis_cluster",
    "redis_cluster_lists",
]
HINTED_NOTIFY_KINDS = [
    "in_process",
    "redis",
    "redis_lists",
    "nats",
    "redis_cluster",
    "redis_cluster_lists",
]
"""Kinds that keep wake budgets: N new jobs wake N idle workers, not every one."""
SHARED_NOTIFY_KINDS = ["noop", "in_process"]
"""In-memory kinds: every client of a test must share one instance to hear the others."""


def make_notify(notify_kind: str, request: pytest.FixtureRequest, prefix: str) -> NotifyAdapter:
    """A new, unconnected adapter of ``notify_kind``; one on a server works under the
    test's ``prefix`` (see :func:`delete_notify_state` for the cleanup)."""
    if notify_kind == "noop":
        return NoopNotifyAdapter()
    if notify_kind == "in_process":
        return InProcessNotifyAdapter()
    if notify_kind == "redis":
        return RedisNotifyAdapter(url=request.getfixturevalue("redis_url"), prefix=prefix)
    if notify_kind == "redis_lists":
        return RedisNotifyAdapter(
            url=request.getfixturevalue("redis_url"), prefix=prefix, wake="lists"
        )
    if notify_kind in ("redis_cluster", "redis_cluster_lists"):
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        wake: WakeMode = "lists" if notify_kind == "redis_cluster_lists" else "pubsub"
        return cluster.adapter(prefix, wake=wake)
    if notify_kind == "postgres":
        return PostgresNotifyAdapter(request.getfixturevalue("postgres_url"), prefix=prefix)
    if notify_kind == "nats":
        return NatsNotifyAdapter(request.getfixturevalue("nats_url"), prefix=prefix)
    raise ValueError(f"unknown notify kind {notify_kind!r}; choose from {NOTIFY_KINDS}")


async def delete_notify_state(
    notify_kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    """Delete what adapters of ``notify_kind`` left on their server under ``prefix``
    (wake budgets); channels and subjects hold nothing once unsubscribed."""
    if notify_kind in ("redis", "redis_lists"):
        await delete_prefix(request.getfixturevalue("redis_url"), prefix)
    elif notify_kind in ("redis_cluster", "redis_cluster_lists"):
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        await asyncio.to_thread(cluster.delete_prefix, prefix)
    elif notify_kind == "nats":
        await delete_nats_bucket(request.getfixturevalue("nats_url"), default_bucket(prefix))


async def delete_nats_bucket(url: str, bucket: str) -> None:
    """Delete the JetStream KV bucket holding a test's wake budgets, if it exists."""
    connection = await nats.connect(url)
    try:
        with suppress(nats.js.errors.NotFoundError):
            await connection.jetstream().delete_key_value(bucket)
    finally:
        await connection.close()


async def drop_tables(engine: AsyncEngine, table_prefix: str) -> None:
    """Drop only the tables that carry this test's prefix; again if the DROP lost a
    deadlock to a worker still claiming from them (Postgres picks one side)."""

    def drop(sync_conn: Any) -> None:
        if sync_conn.dialect.name != "postgresql":
            # SQLite: in the order of their foreign keys, which reflection gives.
            metadata = MetaData()
            metadata.reflect(sync_conn, only=lambda name, _: name.startswith(table_prefix))
            metadata.drop_all(sync_conn)
            return
        # One catalog read and one DROP ... CASCADE: reflecting every table first cost
        # about 50 ms of each test that used Postgres.
        quote = sync_conn.dialect.identifier_preparer.quote
        names = [
            quote(name)
            for name in inspect(sync_conn).get_table_names()
            if name.startswith(table_prefix)
        ]
        if names:
            sync_conn.exec_driver_sql(f"DROP TABLE {', '.join(names)} CASCADE")
        # Migration 0007's function.
        sync_conn.exec_driver_sql(f'DROP FUNCTION IF EXISTS "{table_prefix}claim_limited"')

    for attempt in range(5):
        try:
            async with engine.begin() as conn:
                await conn.run_sync(drop)
            return
        except DBAPIError as exc:
            if "deadlock" not in str(exc.orig) or attempt == 4:
                raise


def other_tasks() -> set[asyncio.Task[Any]]:
    """Tasks still alive besides the current one (should be none after close)."""
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


async def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> None:  # noqa: ASYNC109
    """Poll ``predicate`` (sync or async) until true, or fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def all_but_the_slowest(latencies: list[float]) -> float:
    """The second-largest of ``latencies``: a latency bound asserted on it lets one
    sample absorb a stall of a loaded machine, and still fails when wakeups are slow as
    a rule (tests asserting it are marked ``timing``)."""
    assert len(latencies) >= 3, latencies
    return sorted(latencies)[-2]


class CountingState:
    """The real state adapter, with a count of calls per method (to prove what a worker
    did or did not ask the database)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


class ClaimPasses:
    """The real state adapter, noting a worker's claim passes: one begins with
    ``acquire`` and ends when ``next_due_at`` (which sets the idle sleep) has answered.
    A job committed before that answer may be found by the pass and claimed without any
    wakeup, so a test that needs the worker asleep waits for :meth:`idle` first."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.acquires = 0
        self._ended_after: int | None = None  # ``acquires`` when a pass last ended

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self.acquires += 1
        return await self._inner.acquire(*args, **kwargs)

    async def next_due_at(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._inner.next_due_at(*args, **kwargs)
        finally:
            self._ended_after = self.acquires

    def idle(self) -> bool:
        """Whether the latest pass has ended (and none began since)."""
        return self._ended_after == self.acquires


@asynccontextmanager
async def tasks_shown_after(seconds: float) -> AsyncIterator[None]:
    """Run the block; if it is still running after ``seconds``, print where every task
    of the loop waits (pytest shows it with the failure), so a hang names its await."""

    async def show() -> None:
        await asyncio.sleep(seconds)
        print(f"--- still running after {seconds} s; every task of the loop: ---")
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.print_stack(file=sys.stdout)

    watchdog = asyncio.create_task(show())
    try:
        yield
    finally:
        watchdog.cancel()


def head_revision() -> str:
    """The newest shipped migration's revision id (what ``migrate()`` stamps)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from state_adapters.migrations.runner import SCRIPT_LOCATION

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def job_events(events: list[Any]) -> Any:
    """An ``on_event`` that appends the worker's events about jobs to ``events``, leaving
    out ``loop_blocked``: a loaded machine's report, not something a job did."""

    def record(event: Any) -> None:
        if event.kind != "loop_blocked":
            events.append(event)

    return record
