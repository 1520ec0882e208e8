"""Many workers on one engine share its pool with the application: they keep at most
two connections out of it between them, and the application's own calls still get a
connection at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import Client, InProcessNotifyAdapter, Worker
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.transactions.connection_lanes import DEFAULT_LANES
from tests.support.queue_helpers import drop_tables, wait_until


@pytest.fixture
async def engine(postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    """SQLAlchemy's default pool (5 + 10 overflow); a checkout waits 5 s at most, so a
    pool held for good fails the test quickly instead of after 30 s."""
    engine = create_async_engine(postgres_url, pool_timeout=5)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def _noop(job: Any, ctx: Any) -> None:
    return None


@pytest.mark.parametrize("workers", [16, 32])
@pytest.mark.parametrize("adapters", ["one adapter", "an adapter per worker"])
async def test_many_workers_on_one_engine_leave_the_pool_to_the_application(
    engine: AsyncEngine, prefix: str, workers: int, adapters: str
) -> None:
    notify = InProcessNotifyAdapter()
    states = [SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")]
    await states[0].migrate()
    if adapters == "an adapter per worker":
        states += [
            SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_") for _ in range(workers - 1)
        ]
    clients = [Client(state=s, notify=notify) for s in states]
    app = clients[0]
    async with AsyncExitStack() as stack:
        for n in range(workers):
            worker = Worker(
                clients[n % len(clients)], handlers={"t": _noop}, concurrency=1, poll_interval=0.5
            )
            await stack.enter_async_context(worker)
        # Idle workers keep no more than the lanes of the one pool (once all have started:
        # longer than a second for 32 workers on a loaded machine). Workers holding a
        # connection each would never get there.
        await wait_until(lambda: engine.pool.checkedout() <= 4, timeout=30)  # type: ignore[attr-defined]

        # Fifty chains started and awaited through the pool the workers poll on (each
        # worker every half second) show it left to the application as 200 did.
        chains = [await app.start_chain("t", {"n": n}) for n in range(50)]
        for chain in chains:
            done = await app.await_chain(chain.id, timeout=30)
            assert done.status == "completed"
        # The application's own reads get a connection while workers run (a pool held by
        # the workers would fail them after the fixture's pool_timeout; not timed here:
        # a stalled machine makes any read slow).
        await app.get_chain(chains[0].id)
        await app.count_jobs()
        await wait_until(lambda: engine.pool.checkedout() <= DEFAULT_LANES + 2, timeout=30)  # type: ignore[attr-defined]
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    await notify.close()
