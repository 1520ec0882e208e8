"""Connections workers keep out of the pool for the calls they repeat in a loop.

A pooled checkout is not free under SQLAlchemy's asyncio engine: every checkout and
check-in switches the connection's isolation level, resets it and hops through
greenlets, which costs a third of a claim of ten jobs. A worker claims and completes
jobs back to back for as long as it runs, so it holds a couple of connections instead.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import Pool

from state_adapters.transactions import checkout

DEFAULT_LANES = 2
"""One for claiming and one for writing completions, which a worker overlaps."""

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

    Invariants: never more than ``size`` lanes exist (a lane is counted before its
    connection is opened, so callers arriving together cannot each open one); a lane
    serves one call at a time; a lane whose call failed goes back to the pool (a broken
    connection is never reused: the next call opens another); when the last holder
    leaves, every lane goes back to the pool.
    """

    def __init__(self, engine: AsyncEngine, size: int = DEFAULT_LANES) -> None:
        self._engine = engine
        self._size = size
        self._holders = 0
        self._idle: list[AsyncConnection] = []
        self._open = 0
        """Lanes that exist: idle ones plus those serving a call or being opened."""

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
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A lane if one is free or may be opened, else a pooled connection."""
        if self._idle and self._holders > 0:
            lane = self._idle.pop()
        elif self._open < self._size and self._holders > 0:
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
        if self._holders == 0:
            await self._retire(lane)
        else:
            self._idle.append(lane)

    async def _retire(self, lane: AsyncConnection) -> None:
        self._open -= 1
        await asyncio.shield(lane.close())


async def _close_all(connections: list[AsyncConnection]) -> None:
    for connection in connections:
        await connection.close()
