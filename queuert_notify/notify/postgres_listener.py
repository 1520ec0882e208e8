"""The one LISTEN connection of a ``PostgresNotifyAdapter``, its reader, and its
recovery after a lost connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg
from psycopg import sql

from state_adapters.backoff import Backoff

logger = logging.getLogger(__name__)

_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
# TCP keepalives on the LISTEN connection so a silently dropped peer is noticed
# within about a minute (an idle listener sends nothing that could fail).
_LISTENER_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}

OpenConnection = Callable[[str, Mapping[str, str]], Awaitable[psycopg.AsyncConnection[Any]]]
"""``open(role, options)``: a new autocommit connection of the adapter."""


class ListenConnection:
    """LISTENs the adapter's live channels on one connection and hands every
    notification to ``deliver(channel, payload)``.

    Invariants:

    - The connection is opened by the first :meth:`listen` and closed when
      :meth:`unlisten` finds no live channel left; it and its reader change only
      under one lock, so a LISTEN never races a reconnect.
    - :meth:`listen` returns after Postgres ran the LISTEN: no later notification
      on that channel is missed.
    - When the connection is lost, one recovery task reopens it with the shared
      jittered backoff (holding the lock per attempt only, so ``listen_*`` calls
      are not stuck behind an outage), LISTENs every live channel again, then calls
      ``on_restored`` (notifications may have been missed).
    - After :meth:`close` nothing is reopened and no task is left running.
    """

    def __init__(
        self,
        *,
        open_connection: OpenConnection,
        live_channels: Callable[[], list[str]],
        deliver: Callable[[str, str], None],
        on_restored: Callable[[], None],
        check_open: Callable[[], None],
        log: Mapping[str, str],
        name: str,
    ) -> None:
        self._open_connection = open_connection
        self._live_channels = live_channels
        self._deliver = deliver
        self._on_restored = on_restored
        self._check_open = check_open
        self._log = dict(log)
        self._name = name
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._closed = False

    async def listen(self, channel: str) -> None:
        """LISTEN on the shared connection (opening it first if needed); returns after
        Postgres ran it. ``check_open`` runs under the lock, so nothing opens after
        :meth:`close`."""
        async with self._lock:
            self._check_open()
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                # Lazily opened, or lost and not yet restored: (re)open now.
                conn = await self._reopen()
            await self._run_with_reader_paused(conn, _listen(channel))

    async def unlisten(self, channel: str) -> None:
        """UNLISTEN ``channel``, or release the connection when no channel is live."""
        if self._closed:
            return  # close() drops the connection, and with it every LISTEN
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                return  # a restored connection LISTENs only live channels
            if not self._live_channels():
                await self._release()
                return
            await self._run_with_reader_paused(conn, _unlisten(channel))

    async def close(self) -> None:
        """Stop the recovery and the reader and close the connection; idempotent."""
        self._closed = True
        if self._recovery is not None:
            self._recovery.cancel()
            await asyncio.gather(self._recovery, return_exceptions=True)
        async with self._lock:
            await self._release()

    async def _reopen(self) -> psycopg.AsyncConnection[Any]:
        """Replace the connection with a new one that LISTENs every live channel and
        has a reader. Called with the lock held."""
        await self._release()
        conn = await self._open_connection("listener", _LISTENER_KEEPALIVES)
        try:
            for channel in self._live_channels():
                await conn.execute(_listen(channel))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._start_reader(conn)
        return conn

    async def _release(self) -> None:
        """Stop the reader and close the connection. Called with the lock held."""
        await self._stop_reader()
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _run_with_reader_paused(
        self, conn: psycopg.AsyncConnection[Any], statement: sql.Composed
    ) -> None:
        # The reader holds the connection's lock while it waits for notifications;
        # stopping it is the only way to run a statement. Notifications that arrive
        # meanwhile are kept by psycopg and handed to the next reader.
        await self._stop_reader()
        try:
            await conn.execute(statement)
        finally:
            # Also on failure: a reader on a broken connection notices at once and
            # starts the recovery.
            self._start_reader(conn)

    def _start_reader(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._reader = asyncio.create_task(self._read(conn), name=f"{self._name} reader")

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Deliver notifications until cancelled; on a lost connection, start the recovery."""
        try:
            async for notify in conn.notifies():
                self._deliver(notify.channel, notify.payload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._closed:
                return
            logger.warning(
                "postgres listener lost its connection; reconnecting",
                extra={**self._log, "error": str(exc).strip()},
            )
            if self._recovery is None or self._recovery.done():
                self._recovery = asyncio.create_task(self._recover(), name=f"{self._name} recovery")

    async def _recover(self) -> None:
        """Reopen the connection with jittered backoff, LISTEN every live channel
        again, then call ``on_restored``."""
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX)
        while True:
            # The lock is held per attempt only, so listen_* calls are not stuck
            # behind an outage (they try to reconnect themselves, or fail).
            async with self._lock:
                if self._closed:
                    return
                if not self._live_channels():
                    await self._release()
                    return  # nobody listens any more: nothing to restore
                conn = self._conn
                if conn is not None and not conn.closed and not conn.broken:
                    break  # a listen_* call restored it meanwhile
                try:
                    await self._reopen()
                    break
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    logger.debug(
                        "postgres listener reconnect failed",
                        extra={**self._log, "error": str(exc).strip()},
                    )
            await backoff.sleep()
        logger.info("postgres listener restored", extra=self._log)
        self._on_restored()


def _listen(channel: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


def _unlisten(channel: str) -> sql.Composed:
    return sql.SQL("UNLISTEN {}").format(sql.Identifier(channel))
