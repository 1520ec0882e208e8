"""Connections a worker keeps out of the pool for the calls it repeats in a loop.

A pooled checkout is not free under SQLAlchemy's asyncio engine: every checkout and
check-in switches the connection's isolation level, resets it and hops through
greenlets, which costs a third of a claim of ten jobs. A worker claims and completes
jobs back to back for as long as it runs, so it holds a couple of connections instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

DEFAULT_LANES = 2
"""One for claiming and one for writing completions, which a worker overlaps."""


class ConnectionLanes:
    """Up to ``size`` connections of ``engine`` kept checked out while at least one
    holder is open, each serving one call at a time; a call that finds no free lane
    (or no holder open) uses a pooled connection as usual.

    Invariants: a lane serves one call at a time; a lane whose call failed goes back
    to the pool (a broken connection is never reused: the next call opens another);
    when the last holder leaves, every lane goes back to the pool.
    """

    def __init__(self, engine: AsyncEngine, size: int = DEFAULT_LANES) -> None:
        self._engine = engine
        self._size = size
        self._holders = 0
        self._idle: list[AsyncConnection] = []
        self._busy = 0

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
                # Shielded: a cancelled worker still returns its connections.
                await asyncio.shield(_close_all(idle))

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A lane if one is free or may be opened, else a pooled connection."""
        if self._holders == 0 or (not self._idle and self._busy >= self._size):
            async with self._engine.connect() as pooled:
                yield pooled
            return
        lane = self._idle.pop() if self._idle else await self._engine.connect()
        self._busy += 1
        try:
            yield lane
        except BaseException:
            self._busy -= 1
            await asyncio.shield(lane.close())
            raise
        self._busy -= 1
        if self._holders == 0:
            await asyncio.shield(lane.close())
        else:
            self._idle.append(lane)


async def _close_all(connections: list[AsyncConnection]) -> None:
    for connection in connections:
        await connection.close()
