"""A worker's claims and completions reuse connections kept out of the pool, and give
them all back when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.pool_checks import count_checkouts
from tests.support.queue_helpers import drop_tables

pytest_plugins = ["tests.support.queue_fixtures"]  # ``state`` on the engine below


@pytest.fixture
async def engine(postgres_url: str, table_prefix: str) -> AsyncIterator[AsyncEngine]:
    """Postgres with a pool of four and no overflow, so checkouts can be counted."""
    engine = create_async_engine(postgres_url, pool_size=4, max_overflow=0)
    try:
        yield engine
    finally:
        await drop_tables(engine, table_prefix)
        await engine.dispose()


async def _claim_and_complete(state: SqlAlchemyStateAdapter, rounds: int) -> None:
    notes = NotificationBuffer()
    for _ in range(rounds):
        jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=5)
        await state.complete_jobs(
            [Completion(j.id, j.lease_token or "", output=None) for j in jobs], notes=notes
        )


async def test_claims_and_completions_reuse_held_connections(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    await state.start_chains([NewChain(NewJob("t")) for _ in range(60)], notes=NotificationBuffer())
    # Which types are paused or limited is read once a second, on a pooled connection.
    await state.acquire(["none"], worker_id="w", lease_seconds=30)
    checkouts = count_checkouts(engine)
    async with state.holding_connections():
        await _claim_and_complete(state, 10)
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert checkouts[0] == 1
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    # Without a holder, every call checks a connection out.
    await _claim_and_complete(state, 2)
    assert checkouts[0] == 1 + 4


async def test_a_failed_call_gives_its_connection_back(
    engine: AsyncEngine, state: SqlAlchemyStateAdapter
) -> None:
    notes = NotificationBuffer()
    (blocker,) = await state.start_chains([NewChain(NewJob("t"))], notes=notes)
    await state.start_chains([NewChain(NewJob("d"), blockers=[blocker.id])], notes=notes)
    async with state.holding_connections():
        (job,) = await state.acquire(["t"], worker_id="w", lease_seconds=30)
        # The one-statement completion refuses (the chain has a dependent) on the held
        # connection, which goes back to the pool; the transaction that follows works.
        (done,) = await state.complete_jobs(
            [Completion(job.id, job.lease_token or "", output=1)], notes=notes
        )
        assert done.status == "completed"  # type: ignore[union-attr]
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        (dependent,) = await state.acquire(["d"], worker_id="w", lease_seconds=30)
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert dependent.type_name == "d"
