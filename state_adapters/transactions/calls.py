"""Where a state call's statements run: the caller's transaction (an
``AsyncSession``, ``AsyncConnection`` or a bridged sync connection), never committed
here, or a transaction of the adapter's own, committed — and retried on a deadlock —
before the call returns. Notifications reach the caller's buffer only when the work
succeeded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar, cast

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from state_adapters.notifications import NotificationBuffer
from state_adapters.sync.bridge import SyncConnection
from state_adapters.transactions import checkout
from state_adapters.transactions.after_commit import wrong_session

if TYPE_CHECKING:
    from state_adapters.database import Database

    CallerSession = AsyncSession | AsyncConnection | SyncConnection | None

logger = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[AsyncConnection, NotificationBuffer], Awaitable[T]]
"""Statements to run on a connection, noting what they owe in a buffer."""

_MAX_TRANSACTION_RETRIES = 5


class Transactions:
    """Runs a call's work in the caller's transaction or in one of its own."""

    def __init__(self, engine: AsyncEngine, db: Database) -> None:
        self._engine = engine
        self._db = db

    async def write(self, session: CallerSession, notes: NotificationBuffer, work: Work[T]) -> T:
        """Run ``work`` in the caller's transaction, or in one of our own that is
        committed (and retried on a deadlock) before returning. ``notes`` gets
        the notifications only if the work succeeded."""
        if session is not None:
            staged = NotificationBuffer()
            result = await work(await caller_connection(session), staged)
            notes.absorb(staged)
            return result
        attempt = 0
        while True:
            attempt += 1
            staged = NotificationBuffer()
            try:
                async with checkout.connection(self._engine) as conn, conn.begin():
                    result = await work(conn, staged)
            except DBAPIError as exc:
                if not self._db.is_retryable(exc) or attempt >= _MAX_TRANSACTION_RETRIES:
                    raise
                logger.info("transaction conflict; retrying", extra={"attempt": attempt})
                await asyncio.sleep(0.005 * attempt)
                continue
            notes.absorb(staged)
            return result

    @asynccontextmanager
    async def read(self, session: CallerSession) -> AsyncIterator[AsyncConnection]:
        """The caller's connection, or one of the database's reader."""
        if session is not None:
            yield await caller_connection(session)
            return
        async with checkout.connection(self._db.reader) as conn:
            yield conn


async def caller_connection(
    session: AsyncSession | AsyncConnection | SyncConnection,
) -> AsyncConnection:
    """The connection of the caller's transaction; ``TypeError`` for anything else
    (naming the client a sync ``Session`` belongs to)."""
    if isinstance(session, AsyncSession):
        return await session.connection()
    if isinstance(session, AsyncConnection):
        return session
    if isinstance(session, SyncConnection):
        # Awaits on it finish at once (see state_adapters.sync.bridge).
        return cast(AsyncConnection, session)
    raise wrong_session(session)
