"""Taking a connection out of an engine's pool so that a cancellation cannot strand it.

SQLAlchemy's asyncio checkout awaits the driver after the pool has handed the
connection over: a new connection's setup, and the isolation level an engine made with
``execution_options(isolation_level=...)`` sets on every checkout (the reader's
AUTOCOMMIT). A task cancelled at one of those awaits (a dashboard request whose browser
left: Starlette cancels it again at every await) raises out of the checkout with the
connection still counted as checked out and nothing left to return it. The garbage
collector finds it later ("non-checked-in connection"); a small pool runs out before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


async def start(engine: AsyncEngine) -> AsyncConnection:
    """``await engine.connect()``, whose checkout runs to its end in a task of its own
    when the caller is cancelled meanwhile; the connection is then closed and the
    cancellation re-raised. A cancelled caller waiting on an exhausted pool so waits
    for a connection (at most the pool's timeout) before it stops."""
    checkout = asyncio.ensure_future(engine.connect().start())
    cancelled = await _wait(checkout)
    if cancelled is not None:
        if not checkout.cancelled() and checkout.exception() is None:
            await _wait(asyncio.ensure_future(checkout.result().close()))
        raise cancelled
    return checkout.result()


@asynccontextmanager
async def connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine`` (:func:`start`), closed on the way out; the close too
    runs to its end before a cancellation received meanwhile is re-raised."""
    conn = await start(engine)
    try:
        yield conn
    finally:
        closing = asyncio.ensure_future(conn.close())
        cancelled = await _wait(closing)
        closing.result()
        if cancelled is not None:
            raise cancelled


async def _wait(task: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait for ``task`` to end, however often this caller is cancelled meanwhile; the
    last cancellation received, for the caller to re-raise."""
    cancelled = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
    return cancelled
