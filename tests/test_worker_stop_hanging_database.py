"""A worker asked to stop while its database hangs stops within ``drain_timeout``:
whatever is still waiting on the database (a completion being written, a claim) is
cancelled, and the jobs run again once their leases expire, as after a kill.

The engine reaches the shared Postgres through a TCP proxy of the test's own, which
blackholes the connections (a hung server or a partitioned network)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import Client, InProcessNotifyAdapter, Worker
from queuert_notify.worker.worker import WorkerMode
from state_adapters import SqlAlchemyStateAdapter
from tests.support.queue_helpers import drop_tables
from tests.support.tcp_proxy import TcpProxy

DRAIN_TIMEOUT = 1.0
LEASE = 3.0
SLACK = 4.0
"""Seconds stop() may take beyond drain_timeout: cancelling and closing what is left,
and a stall of a loaded machine (a stop that waited on the hung database would never
return)."""


@pytest.fixture
async def proxy(postgres_url: str) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy.in_front_of(postgres_url)
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def state(postgres_url: str, proxy: TcpProxy, prefix: str) -> AsyncIterator[Any]:
    engine: AsyncEngine = create_async_engine(proxy.url(postgres_url), pool_timeout=2)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    try:
        yield state
    finally:
        await proxy.close()  # drops the blackholed links, so the pool can let them go
        await engine.dispose()
        clean = create_async_engine(postgres_url)
        await drop_tables(clean, f"{prefix}_")
        await clean.dispose()


async def _stop_while_the_database_hangs(
    state: Any, proxy: TcpProxy, mode: WorkerMode, *, force: bool, drain_timeout: float
) -> float:
    returned = asyncio.Event()
    runs = 0

    async def handler(job: Any, ctx: Any) -> dict[str, bool]:
        nonlocal runs
        runs += 1
        if runs > 1:
            return {"done": True}
        if mode == "atomic":
            # Written through ctx.session: the completion commits in this transaction.
            await ctx.session.execute(text("SELECT 1"))
        await asyncio.sleep(0.2)
        proxy.mode = "blackhole"  # the completion's write goes nowhere
        returned.set()
        return {"done": True}

    client = Client(state=state, notify=InProcessNotifyAdapter())
    await client.connect()
    chain = await client.start_chain("work", {})
    worker = Worker(
        client,
        handlers={"work": handler},
        mode=mode,
        drain_timeout=drain_timeout,
        poll_interval=0.2,
        lease=LEASE,
    )
    async with asyncio.timeout(30):
        runner = asyncio.create_task(worker.run(handle_signals=False))
        await returned.wait()
        await asyncio.sleep(0.2)  # the completion is on its way to the hung database
        started = time.monotonic()
        await asyncio.wait_for(worker.stop(force=force), drain_timeout + SLACK + 5)
        took = time.monotonic() - started
        await asyncio.wait_for(runner, 10)
    proxy.mode = "forward"
    # The cancelled completion either never committed (the job runs again once its
    # lease expires) or committed late; either way the chain completes exactly once.
    async with Worker(client, handlers={"work": handler}, reap_interval=0.2, poll_interval=0.2):
        done = await client.await_chain(chain.id, timeout=LEASE + 10)
    assert done.status == "completed" and done.output == {"done": True}
    assert runs in (1, 2)
    await asyncio.wait_for(client.close(), 10)
    return took


@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_stop_returns_within_drain_timeout_while_completions_hang(
    state: Any, proxy: TcpProxy, mode: WorkerMode
) -> None:
    took = await _stop_while_the_database_hangs(
        state, proxy, mode, force=False, drain_timeout=DRAIN_TIMEOUT
    )
    assert took <= DRAIN_TIMEOUT + SLACK


async def test_forced_stop_returns_at_once_while_completions_hang(
    state: Any, proxy: TcpProxy
) -> None:
    # A drain timeout far above the slack: a stop that drained would be seen.
    took = await _stop_while_the_database_hangs(
        state, proxy, "staged", force=True, drain_timeout=30.0
    )
    assert took <= SLACK
