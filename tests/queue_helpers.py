"""Helpers for client, worker and end-to-end tests (fixtures are in queue_fixtures)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.notify.protocol import NotifyAdapter

STATE_KINDS = ["sqlite", "postgres"]
NOTIFY_KINDS = ["noop", "in_process", "redis"]


def make_notify(notify_kind: str, request: pytest.FixtureRequest, prefix: str) -> NotifyAdapter:
    """A new, unconnected adapter of ``notify_kind`` (Redis under the test's prefix)."""
    if notify_kind == "noop":
        from queuert_notify.notify.noop import NoopNotifyAdapter

        return NoopNotifyAdapter()
    if notify_kind == "in_process":
        from queuert_notify.notify.in_process import InProcessNotifyAdapter

        return InProcessNotifyAdapter()
    redis_module = pytest.importorskip(
        "queuert_notify.notify.redis", reason="RedisNotifyAdapter has not landed yet"
    )
    url = request.getfixturevalue("redis_url")
    adapter: NotifyAdapter = redis_module.RedisNotifyAdapter(url=url, prefix=prefix)
    return adapter


async def drop_tables(engine: AsyncEngine, table_prefix: str) -> None:
    """Drop only the tables that carry this test's prefix."""

    def drop(sync_conn: Any) -> None:
        metadata = MetaData()
        metadata.reflect(sync_conn, only=lambda name, _: name.startswith(table_prefix))
        metadata.drop_all(sync_conn)

    async with engine.begin() as conn:
        await conn.run_sync(drop)


async def delete_redis_keys(url: str, prefix: str) -> None:
    """Delete only keys under this test's prefix."""
    import redis.asyncio as redis

    connection = redis.Redis.from_url(url)
    try:
        keys = [key async for key in connection.scan_iter(match=f"{prefix}:*")]
        if keys:
            await connection.delete(*keys)
    finally:
        await connection.aclose()


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
