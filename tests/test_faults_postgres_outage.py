"""A database that is unreachable for a moment (a restart, a failover: connections are
refused, then accepted again) costs latency, never a job run twice or a failed call.

The test's engine reaches the shared Postgres through a TCP proxy of its own, which
refuses connections for a while; the server itself is never touched."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import ChainSpec, Client, InProcessNotifyAdapter, Worker
from queuert_notify.worker.worker import WorkerMode
from state_adapters import SqlAlchemyStateAdapter
from tests.support.queue_helpers import drop_tables
from tests.support.tcp_proxy import TcpProxy

OUTAGE = 2.0
"""Seconds the proxy refuses connections."""


@pytest.fixture
async def proxy(postgres_url: str) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy.in_front_of(postgres_url)
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def engine(postgres_url: str, proxy: TcpProxy, prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(proxy.url(postgres_url), pool_size=20)
    try:
        yield engine
    finally:
        await proxy.restore()
        await engine.dispose()
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_jobs_in_flight_through_a_refusing_database_run_once_and_client_calls_wait(
    engine: AsyncEngine, proxy: TcpProxy, prefix: str, mode: WorkerMode
) -> None:
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    runs: Counter[str] = Counter()
    handlers_started = asyncio.Event()

    async def handler(job: Any, ctx: Any) -> dict[str, int]:
        runs[job.id] += 1
        handlers_started.set()
        await asyncio.sleep(0.5)  # still running when the database goes away
        return {"n": job.input["n"]}

    # The calls below wait out the outage; the 5 s default wait would leave a stalled
    # machine no room between the outage's start and the check that they still wait.
    notify = InProcessNotifyAdapter()
    async with Client(state=state, notify=notify, database_timeout=60) as client:
        specs = [ChainSpec(type_name="work", input={"n": n}) for n in range(32)]
        chains = [c.id for c in await client.start_chains(specs)]
        worker = Worker(
            client,
            handlers={"work": handler},
            concurrency=32,
            mode=mode,
            lease=30.0,
            poll_interval=0.5,
        )
        async with worker:
            await handlers_started.wait()
            await proxy.refuse()
            # Calls made while the database refuses wait for it instead of failing.
            during_start = asyncio.create_task(client.start_chain("work", {"n": 32}))
            during_read = asyncio.create_task(client.get_chain(chains[0]))
            during_count = asyncio.create_task(client.count_jobs())
            await asyncio.sleep(OUTAGE)
            assert not during_start.done() and not during_read.done()
            await proxy.restore()
            chains.append((await during_start).id)
            await during_read
            await during_count
            for chain_id in chains:
                done = await client.await_chain(chain_id, timeout=20)
                assert done.status == "completed", done
    assert len(runs) == 33
    assert set(runs.values()) == {1}, {job: n for job, n in runs.items() if n != 1}
