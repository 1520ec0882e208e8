"""A Redis that stops answering never holds up the application's writes: the wakeup of
a committed start is sent on the adapter's sender task, off the caller's path, and the
job is found by polling if Redis stays away."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, RedisNotifyAdapter, Worker
from queuert_notify.client.client import CLOSE_FLUSH_LIMIT
from state_adapters import SqlAlchemyStateAdapter
from tests.support.services import OwnServer
from tests.support.tcp_proxy import TcpProxy

STARTS = 50


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[SqlAlchemyStateAdapter]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    adapter = SqlAlchemyStateAdapter(engine)
    await adapter.migrate()
    yield adapter
    await engine.dispose()


async def _start_times(client: Client, n: int) -> list[float]:
    times = []
    for i in range(n):
        started = time.perf_counter()
        await client.start_chain("t", {"i": i})
        times.append(time.perf_counter() - started)
    return times


def _p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98]


async def _noop(job: Any, ctx: Any) -> None:
    return None


async def test_start_chain_is_not_held_up_by_a_blackholed_redis(
    state: SqlAlchemyStateAdapter, private_redis: OwnServer, prefix: str
) -> None:
    proxy = await TcpProxy.in_front_of(private_redis.url)
    notify = RedisNotifyAdapter(url=proxy.url(private_redis.url), prefix=prefix)
    client = Client(state=state, notify=notify)
    try:
        await client.connect()
        normal = await _start_times(client, STARTS)
        proxy.mode = "blackhole"
        hung = await _start_times(client, STARTS)
        # Within a few ms of normal (this machine is shared: allow for its noise).
        assert _p99(hung) <= _p99(normal) + 0.02, (_p99(normal), _p99(hung))
        closing = time.perf_counter()
        await client.close()
        assert time.perf_counter() - closing < CLOSE_FLUSH_LIMIT + 2.0
    finally:
        await notify.close()
        await proxy.close()
    assert sum((await state.count_jobs()).values()) == 2 * STARTS


async def test_start_chain_is_not_held_up_by_client_pause(
    state: SqlAlchemyStateAdapter, private_redis: OwnServer, prefix: str
) -> None:
    admin = redis_asyncio.Redis.from_url(private_redis.url)
    async with Client(
        state=state, notify=RedisNotifyAdapter(url=private_redis.url, prefix=prefix)
    ) as client:
        normal = await _start_times(client, STARTS)
        await admin.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        paused = await _start_times(client, STARTS)
        assert _p99(paused) <= _p99(normal) + 0.02, (_p99(normal), _p99(paused))
        assert sum((await state.count_jobs()).values()) == 2 * STARTS
        # Nothing was lost: once Redis answers again, a worker runs every job.
        async with Worker(client, handlers={"t": _noop}, poll_interval=3600, concurrency=10):
            deadline = time.monotonic() + 20
            while (await state.count_jobs()).get("completed", 0) < 2 * STARTS:
                assert time.monotonic() < deadline, await state.count_jobs()
                await asyncio.sleep(0.05)
    await admin.aclose()
