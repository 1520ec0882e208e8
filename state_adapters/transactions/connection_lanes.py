"""Connections kept out of the pool for the calls repeated back to back.

A pooled checkout is not free under SQLAlchemy's asyncio engine: every checkout and
check-in switches the connection's isolation level, resets it and hops through
greenlets, which costs a third of a claim of ten jobs and half of a plain start. A
worker claims and completes jobs back to back for as long as it runs, so it holds a
couple of connections instead; an application starting chains one after another keeps
the connection of one start for the next, until its event loop runs a turn without one.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import Pool, QueuePool

from state_adapters.transactions import checkout

DEFAULT_LANES = 2
"""One for claiming and one for writing completions, which a worker overlaps."""

logger = logging.getLogger(__name__)

_BY_POOL: weakref.WeakKeyDictionary[Pool, ConnectionLanes] = weakref.WeakKeyDictionary()


def lanes_for(engine: AsyncEngine, size: int = DEFAULT_LANES) -> ConnectionLanes:
    """The lanes of ``engine``'s connection pool, shared by every adapter and worker on
    that pool: however many workers an application runs on one engine, they keep at
    most ``size`` connections out of its pool between them."""
    pool = engine.sync_engine.pool
    lanes = _BY_POOL.get(pool)
    if lanes is None:
        lanes = _BY_POOL[pool] = ConnectionLanes(engine, size)
    return lanes


class ConnectionLanes:
    """At most ``size`` connections of ``engine`` kept checked out while at least one
    holder is open, each serving one call at a time; a call that finds no free lane
    (or no holder open) uses a pooled connection as usual.

    With no holder open, a call that may :meth:`linger <connection>` keeps one lane past
    its end, which goes back to the pool as soon as the event loop runs a callback
    while no call uses it: calls back to back in one task take one connection out of
    the pool between them, and an idle application keeps none past a turn of its loop.
    It is not kept when the pool has no connection left to give (another task may be
    waiting for one: it gets this one, as before).

    Lanes belong to the event loop that opened the first of them: a call from another
    loop (another thread's, or a later ``asyncio.run``'s while a lane of the earlier
    one is still being given back) uses a pooled connection, as a driver connection
    must not be used from a loop other than its own.

    Invariants: never more than ``size`` lanes exist (a lane is counted before its
    connection is opened, so callers arriving together cannot each open one), nor more
    than one with no holder open; a lane serves one call at a time, and between calls
    is in no transaction (each call's is committed or rolled back by then); a lane
    whose call failed or whose connection was invalidated goes back to the pool (a
    broken connection is never reused: the next call opens another); when the last
    holder leaves, every lane goes back to the pool.
    """

    def __init__(self, engine: AsyncEngine, size: int = DEFAULT_LANES) -> None:
        self._engine = engine
        self._size = size
        self._holders = 0
        self._idle: list[AsyncConnection] = []
        self._open = 0
        """Lanes that exist: idle ones plus those serving a call or being opened."""
        self._returning: asyncio.AbstractEventLoop | None = None
        """The loop on which :meth:`_return_idle` is due (no holder open)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the lanes belong to (set by the first lane while none is open)."""

    @property
    def open(self) -> int:
        """How many connections the lanes hold out of the pool now."""
        return self._open

    @asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        """Keep lanes while this is open (nested and concurrent holders share them)."""
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0:
                idle, self._idle = self._idle, []
                self._open -= len(idle)
                # Shielded: a cancelled worker still returns its connections.
                await asyncio.shield(_close_all(idle))

    @asynccontextmanager
    async def connection(self, *, linger: bool = False) -> AsyncIterator[AsyncConnection]:
        """A lane if one is free or may be opened, else a pooled connection.

        ``linger``: with no holder open too, one lane; kept after the call until the
        loop next runs its callbacks (for a plain start, whose caller may start another
        at once)."""
        kept = (self._holders > 0 or linger) and self._on_this_loop()
        if self._idle and kept:
            lane = self._idle.pop()
        elif kept and self._open < (self._size if self._holders > 0 else 1):
            self._open += 1
            try:
                lane = await checkout.start(self._engine)
            except BaseException:
                self._open -= 1
                raise
        else:
            async with checkout.connection(self._engine) as pooled:
                yield pooled
            return
        try:
            yield lane
        except BaseException:
            await self._retire(lane)
            raise
        if lane.invalidated or not (self._holders > 0 or (linger and not self._pool_full())):
            await self._retire(lane)
            return
        self._idle.append(lane)
        if self._holders == 0:
            self._return_soon()

    def _on_this_loop(self) -> bool:
        """Whether the lanes belong to the running loop (they do when none is open)."""
        loop = asyncio.get_running_loop()
        if self._open == 0:
            self._loop = loop
        return self._loop is loop

    def _pool_full(self) -> bool:
        """Whether a checkout could be waiting on the pool now: a queue pool (the
        default) with every connection it may open checked out. Pools of other kinds
        (``NullPool``, ``StaticPool``) make no checkout wait."""
        pool = self._engine.sync_engine.pool
        if not isinstance(pool, QueuePool) or pool._max_overflow < 0:  # -1: no limit
            return False
        return pool.checkedout() >= pool.size() + pool._max_overflow

    async def _retire(self, lane: AsyncConnection) -> None:
        self._open -= 1
        await asyncio.shield(lane.close())

    def _return_soon(self) -> None:
        """Have :meth:`_return_idle` run once the loop gets to its callbacks (a call that
        takes the lane meanwhile asks again when it ends)."""
        loop = asyncio.get_running_loop()
        if self._returning is not loop:  # another loop's is stale: that loop is gone
            self._returning = loop
            loop.call_soon(self._return_idle)

    def _return_idle(self) -> None:
        """Give the idle lanes back to the pool unless a holder came meanwhile. The close
        runs in a task no cancellation stops: ``asyncio.run`` cancels the tasks left
        when its coroutine returns, before they ran, and would strand the connection."""
        self._returning = None
        if self._holders > 0 or not self._idle:
            return
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        returning = _Uncancellable(_close_all(idle))
        _RETURNING.add(returning)
        returning.add_done_callback(_RETURNING.discard)


async def _close_all(connections: list[AsyncConnection]) -> None:
    """Give ``connections`` back to their pool, or close them when it was disposed;
    one that fails does not keep the others out of the pool."""
    for connection in connections:
        try:
            if _pool_disposed(connection):
                await connection.invalidate()  # closes the driver's connection
            await connection.close()
        except Exception as exc:  # logged: the pool opens another in its place
            logger.warning("a kept database connection failed to close: %r", exc)


def _pool_disposed(connection: AsyncConnection) -> bool:
    """Whether ``connection`` was checked out of a pool its engine has since replaced
    (``engine.dispose()`` closes the connections in the pool, leaves the checked-out
    ones to their users): back in the old pool, which nothing uses, it would stay open.
    Read from private attributes; one another SQLAlchemy version lacks says no."""
    sync = connection.sync_connection
    pool = getattr(getattr(sync, "_dbapi_connection", None), "_pool", None)
    return sync is not None and pool is not None and pool is not sync.engine.pool


class _Uncancellable(asyncio.Task[None]):
    """A task that runs to its end: :meth:`cancel` declines, as for a task already done.
    So would a timeout inside it (timeouts cancel): what bounds a return is the pool's
    check-in, which on asyncpg and psycopg sends nothing to the server (the connection
    is idle, in autocommit), and SQLAlchemy's own shielded close with its timeout."""

    def cancel(self, msg: Any = None) -> bool:
        return False


_RETURNING: set[asyncio.Task[None]] = set()
"""The returns under way (the loop keeps only weak references to tasks)."""
