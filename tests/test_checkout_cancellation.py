"""A connection taken out of the pool for one call goes back, however often the call's
task is cancelled while the connection is checked out or closed (a dashboard request
whose browser left: Starlette cancels it again at every await)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from state_adapters.transactions import checkout
from tests.conftest import ASYNC_POSTGRES_DRIVERS, with_driver
from tests.support.pool_checks import cancelled_at_every_await


@pytest.mark.parametrize("driver", ASYNC_POSTGRES_DRIVERS)
@pytest.mark.parametrize("fresh", [True, False], ids=["new-connection", "pooled"])
async def test_a_call_cancelled_at_every_await_gives_its_connection_back(
    postgres_url: str, driver: str, fresh: bool
) -> None:
    engine = create_async_engine(with_driver(postgres_url, driver), pool_size=1, max_overflow=0)
    # The reader's isolation level is set at every checkout and reset at every close.
    reader = engine.execution_options(isolation_level="AUTOCOMMIT")
    try:
        if not fresh:
            async with checkout.connection(reader):
                pass

        async def one_call() -> None:
            async with checkout.connection(reader) as conn:
                await conn.exec_driver_sql("SELECT 1")

        for cancels_after in range(12):
            await cancelled_at_every_await(one_call, after=cancels_after)
            assert engine.sync_engine.pool.checkedout() == 0, f"after {cancels_after}"  # type: ignore[attr-defined]
        # The pool's only connection is there to be taken (no stranded checkout).
        async with asyncio.timeout(10), checkout.connection(reader) as conn:
            assert (await conn.exec_driver_sql("SELECT 2")).scalar() == 2
    finally:
        await engine.dispose()
