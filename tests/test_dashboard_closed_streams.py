"""A dashboard its browsers keep leaving: live pages closed, requests aborted while their
read waits on the database. Each gives back what it took (its pooled connection, its
notify subscriptions), so a small pool and a long-running process never run out. A real
server, a real Postgres with a pool of one connection, a real Redis."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import Client, RedisNotifyAdapter
from queuert_notify.dashboard import create_app
from state_adapters import SqlAlchemyStateAdapter
from tests.support.dashboard_server import served
from tests.support.queue_helpers import drop_tables, wait_until
from tests.support.redis_helpers import delete_prefix

# A connection or a client the garbage collector finds still open is a warning: an error.
pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("error")]

STREAMS = 6
"""Live pages opened and closed, or requests aborted, per test: each leak would stay."""


@pytest.fixture
async def dashboard(
    postgres_url: str, redis_url: str, prefix: str
) -> AsyncIterator[tuple[str, AsyncEngine, Client]]:
    """The dashboard served on a pool of one connection and no overflow (a connection
    lost to one request is the whole pool), with Redis for live updates."""
    engine = create_async_engine(postgres_url, pool_size=1, max_overflow=0, pool_timeout=10)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    notify = RedisNotifyAdapter(redis_url, prefix=prefix)
    try:
        async with (
            Client(state=state, notify=notify) as client,
            served(create_app(state, notify)) as url,
        ):
            yield url, engine, client
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
        await delete_prefix(redis_url, prefix)
        gc.collect()  # what was dropped unclosed warns now, inside the test


async def test_live_pages_closed_by_their_browser_leave_no_subscription_behind(
    dashboard: tuple[str, AsyncEngine, Client], redis_url: str, prefix: str
) -> None:
    url, engine, client = dashboard
    chain = await client.start_chain("send-email", {"to": "a@example.com"})
    async with httpx.AsyncClient(base_url=url, timeout=30) as h:
        for _ in range(STREAMS):
            async with h.stream("GET", f"/chains/{chain.id}?live=1") as stream:
                # The first update is sent once the stream follows what the page shows
                # (its chain, and the types it lists).
                await _until_event(stream, "update")
        # Nobody watches any page now: the dashboard listens to nothing.
        await wait_until(lambda: _nothing_subscribed(redis_url, prefix), timeout=10)
        await wait_until(lambda: engine.pool.checkedout() == 0, timeout=10)
        assert (await h.get(f"/chains/{chain.id}")).status_code == 200


async def test_streams_and_pages_aborted_mid_read_give_their_connection_back(
    dashboard: tuple[str, AsyncEngine, Client], postgres_url: str, prefix: str
) -> None:
    """Each request is aborted while its read waits on a lock: the read holds the pool's
    only connection then. A live stream is cancelled there; a page finishes its read."""
    url, engine, client = dashboard
    chain = await client.start_chain("send-email", {"to": "a@example.com"})
    port = int(url.rsplit(":", 1)[1])
    other = create_async_engine(postgres_url)
    try:
        for n in range(STREAMS):
            path = f"/chains/{chain.id}" + ("?live=1" if n % 2 else "")
            async with other.connect() as locker:
                await locker.execute(text(f"LOCK TABLE {prefix}_jobs IN ACCESS EXCLUSIVE MODE"))
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await writer.drain()
                await wait_until(lambda: _waiting_on_a_lock(other, prefix), timeout=30)
                writer.transport.abort()
                await locker.rollback()
        await wait_until(lambda: engine.pool.checkedout() == 0, timeout=10)
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            assert (await h.get(f"/chains/{chain.id}")).status_code == 200
            assert (await h.get("/")).status_code == 200
    finally:
        await other.dispose()


async def _until_event(stream: httpx.Response, name: str) -> None:
    async for line in stream.aiter_lines():
        if line == f"event: {name}":
            return
    raise AssertionError(f"the stream ended before an {name!r} event")


async def _nothing_subscribed(redis_url: str, prefix: str) -> bool:
    """True when no channel of ``prefix`` has a subscriber on the server."""
    admin = Redis.from_url(redis_url)
    try:
        return await admin.pubsub_channels(f"{prefix}:*") == []
    finally:
        await admin.aclose()


async def _waiting_on_a_lock(engine: AsyncEngine, prefix: str) -> bool:
    """True when a query on this test's tables waits for a lock (the dashboard's read,
    behind the test's LOCK TABLE)."""
    async with engine.connect() as conn:
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE :tables"
        )
        return bool((await conn.execute(query, {"tables": f"%{prefix}_%"})).scalar())
