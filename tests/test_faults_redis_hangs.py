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
from queuert_notify.worker.shutdown import CANCEL_GRACE
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


PAUSE = 6.0
"""Seconds of CLIENT PAUSE: a start that waited for Redis would wait about this long."""
STALL = 3.0
"""Seconds the starts may take beyond the normal ones in all: a stall of a loaded machine
fits, a start that waited for the paused (or blackholed) Redis does not."""


async def _start_times(client: Client, n: int) -> list[float]:
    times = []
    async with asyncio.timeout(30):  # a start waiting for a blackholed Redis never returns
        for i in range(n):
            started = time.perf_counter()
            await client.start_chain("t", {"i": i})
            times.append(time.perf_counter() - started)
    return times


def _not_held_up(normal: list[float], hung: list[float]) -> None:
    """Every start as fast as before: the typical one within a few ms (one start that a
    stall of the machine delays moves no median), and no start waited for Redis."""
    typical = (statistics.median(normal), statistics.median(hung))
    assert typical[1] <= typical[0] + 0.02, typical
    assert sum(hung) <= sum(normal) + STALL, (sum(normal), sum(hung))


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
        _not_held_up(normal, hung)
        closing = time.perf_counter()
        await client.close()
        # Bounded by the flush limit and the adapter's close_timeout (5 s each).
        assert time.perf_counter() - closing < CLOSE_FLUSH_LIMIT + 5.0
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
        await admin.execute_command("CLIENT", "PAUSE", str(int(PAUSE * 1000)), "ALL")
        paused = await _start_times(client, STARTS)
        _not_held_up(normal, paused)
        assert sum((await state.count_jobs()).values()) == 2 * STARTS
        # Nothing was lost: once Redis answers again, a worker runs every job.
        async with Worker(client, handlers={"t": _noop}, poll_interval=3600, concurrency=10):
            deadline = time.monotonic() + 20
            while (await state.count_jobs()).get("completed", 0) < 2 * STARTS:
                assert time.monotonic() < deadline, await state.count_jobs()
                await asyncio.sleep(0.05)
    await admin.aclose()


JOBS = 10


async def _sleepy(job: Any, ctx: Any) -> None:
    await asyncio.sleep(float(job.input.get("sleep", 0)))


async def _wait_completed(state: SqlAlchemyStateAdapter, n: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (await state.count_jobs()).get("completed", 0) < n:
        assert time.monotonic() < deadline, await state.count_jobs()
        await asyncio.sleep(0.05)


@pytest.mark.timing
@pytest.mark.parametrize("wake", ["pubsub", "lists"])
async def test_a_blackholed_redis_leaves_the_worker_at_its_polling_rate(
    state: SqlAlchemyStateAdapter, private_redis: OwnServer, prefix: str, wake: str
) -> None:
    """Calls to a Redis that never answers (a wake hint, an acknowledgement, the first
    listen for a job's ownership loss) cost the worker no more than its poll interval:
    ten short jobs run within a few polls (they took ~21 s at poll_interval=2, each
    handler start waiting for the Redis client to give up)."""
    proxy = await TcpProxy.in_front_of(private_redis.url)
    notify = RedisNotifyAdapter(url=proxy.url(private_redis.url), prefix=prefix, wake=wake)  # type: ignore[arg-type]
    client = Client(state=state, notify=notify)
    try:
        await client.connect()
        async with Worker(client, {"t": _sleepy}, poll_interval=2, concurrency=4):
            proxy.mode = "blackhole"
            for _ in range(JOBS):
                await client.start_chain("t", {})
            # A poll interval finds them; two more allow for a stalled machine.
            await _wait_completed(state, JOBS, within=3 * 2 + 4)
    finally:
        proxy.mode = "forward"
        await client.close()
        await proxy.close()


@pytest.mark.timing
@pytest.mark.parametrize("wake", ["pubsub", "lists"])
async def test_stop_keeps_its_drain_timeout_while_redis_is_blackholed(
    state: SqlAlchemyStateAdapter, private_redis: OwnServer, prefix: str, wake: str
) -> None:
    """A worker stopping with a job that outlives ``drain_timeout`` while Redis hangs
    returns after the drain timeout and the cancel grace, and the client's close after
    its flush limit (lists mode took ~41 s, waiting on a CLIENT UNBLOCK)."""
    proxy = await TcpProxy.in_front_of(private_redis.url)
    notify = RedisNotifyAdapter(url=proxy.url(private_redis.url), prefix=prefix, wake=wake)  # type: ignore[arg-type]
    client = Client(state=state, notify=notify)
    drain = 1.0
    try:
        await client.connect()
        worker = Worker(client, {"t": _sleepy}, poll_interval=0.5, drain_timeout=drain)
        await worker.__aenter__()
        await client.start_chain("t", {"sleep": 60})
        await wait_until_running(state)
        proxy.mode = "blackhole"
        stopping = time.monotonic()
        await worker.stop()
        await client.close()
        took = time.monotonic() - stopping
        # drain + CANCEL_GRACE + CLOSE_FLUSH_LIMIT, and as much again for a slow machine.
        assert took < 2 * (drain + CANCEL_GRACE + CLOSE_FLUSH_LIMIT), took
    finally:
        proxy.mode = "forward"
        await client.close()
        await proxy.close()


async def wait_until_running(state: SqlAlchemyStateAdapter) -> None:
    deadline = time.monotonic() + 20
    while (await state.count_jobs()).get("running", 0) < 1:
        assert time.monotonic() < deadline, await state.count_jobs()
        await asyncio.sleep(0.05)
