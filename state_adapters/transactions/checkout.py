"""Taking a connection out of an engine's pool so that a cancellation cannot strand it.

SQLAlchemy's asyncio checkout awaits the driver after the pool has handed the
connection over: a new connection's setup, and the isolation level an engine made with
``execution_options(isolation_level=...)`` sets on every checkout (the reader's
AUTOCOMMIT). A task cancelled at one of those awaits (a dashboard request whose browser
left: Starlette cancels it again at every await) raises out of the checkout with the
connection still counted as checked out and nothing left to return it. The garbage
collector finds it later ("non-checked-in connection"); a small pool runs out before.

So the checkout runs in a task of its own, and the close runs to its end whatever
happens to the caller meanwhile (:class:`_ToTheEnd`) in the caller's own task: a
pooled connection's close mostly awaits nothing at all, and awaits no timeout of the
caller's task when it does, and a task of its own (the ``asyncio.shield`` way) would
cost event-loop iterations per connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Generator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

T = TypeVar("T")


async def start(engine: AsyncEngine) -> AsyncConnection:
    """``await engine.connect()``, whose checkout runs to its end in a task of its own
    when the caller is cancelled meanwhile; the connection is then closed and the
    cancellation re-raised. A cancelled caller waiting on an exhausted pool so waits
    for a connection (at most the pool's timeout) before it stops.

    A task, not :class:`_ToTheEnd`: a checkout may open a connection or wait on the
    pool under a timeout of the driver's (asyncpg's ``connect``) or the pool's
    (``wait_for`` on Python 3.12), which cancels the task it was entered in; run in
    the caller's task, that cancellation would be kept from the checkout, which would
    then wait past its timeout. Unless the pool hands over a live idle connection
    (:func:`_hands_over_at_once`): no connect and no wait, so no such timeout, and the
    checkout runs in the caller's task (:class:`_ToTheEnd`), sparing the task's
    event-loop iterations."""
    if _hands_over_at_once(engine):
        inline = _ToTheEnd(engine.connect().start())
        conn = await inline
        if inline.cancelled is not None:
            await _ToTheEnd(conn.close())
            raise inline.cancelled
        return conn
    checkout = asyncio.ensure_future(engine.connect().start())
    cancelled = None
    while not checkout.done():
        try:
            await asyncio.shield(checkout)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not checkout.cancelled() and checkout.exception() is None:
            await _ToTheEnd(checkout.result().close())
        raise cancelled
    return checkout.result()


def _hands_over_at_once(engine: AsyncEngine) -> bool:
    """Whether ``engine``'s pool (SQLAlchemy's asyncio queue pool) will hand over an
    idle connection that it need not reopen, nor ping: the checkout then neither
    connects nor waits. Read from the pool's private state as the pool's own checkout
    reads it (``_ConnectionRecord.get_connection``); anything else, or an attribute
    missing in another SQLAlchemy version, says no."""
    pool: Any = engine.sync_engine.pool
    try:
        idle = pool._pool.__dict__["_queue"]._queue  # the memoized asyncio.Queue's deque
        record = idle[-1] if pool._pool.use_lifo else idle[0]
        return bool(
            record.dbapi_connection is not None
            and not pool._pre_ping
            and pool._recycle < 0
            and pool._invalidate_time <= record.starttime
            and record._soft_invalidate_time <= record.starttime
        )
    except (AttributeError, KeyError, IndexError):
        return False


@asynccontextmanager
async def connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine`` (:func:`start`), closed on the way out; the close too
    runs to its end before a cancellation received meanwhile is re-raised."""
    conn = await start(engine)
    try:
        yield conn
    finally:
        closing = _ToTheEnd(conn.close())
        await closing
        if closing.cancelled is not None:
            raise closing.cancelled


class _ToTheEnd(Generic[T]):
    """Awaiting it runs ``coro`` to its end in the awaiting task, however often that
    task is cancelled meanwhile; :attr:`cancelled` is then the last cancellation
    received, for the caller to re-raise. An exception of ``coro`` propagates, or that
    cancellation when there was one (chained to it).

    Invariant: a cancellation never reaches ``coro`` nor the future it waits on.
    ``Task.cancel`` cancels the future its task waits on; so while ``coro`` waits on a
    future, the task waits on a stand-in that the future's outcome completes, and a
    cancellation only cancels the stand-in: ``coro`` goes on waiting on its future."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self.cancelled: asyncio.CancelledError | None = None

    def __await__(self) -> Generator[Any, None, T]:
        coro = self._coro
        try:
            while True:
                try:
                    waited = coro.send(None)
                except StopIteration as returned:
                    result: T = returned.value
                    return result
                except BaseException as exc:
                    if self.cancelled is not None:
                        raise self.cancelled from exc
                    raise
                yield from self._wait(waited)
        finally:
            coro.close()  # only still running when this awaiter is closed itself

    def _wait(self, waited: Any) -> Generator[Any, None, None]:
        """Until ``waited`` (what ``coro`` yielded: a future, or ``None`` to let the loop
        run once) is done and its earlier callbacks ran, with cancellations kept rather
        than delivered."""
        if waited is None:
            try:
                yield None
            except asyncio.CancelledError as exc:
                self.cancelled = exc
            return
        waited._asyncio_future_blocking = False  # as a task does with what it awaits
        # Resumed from a callback of ``waited``, as a task is: its earlier callbacks run
        # first (asyncio's sock_connect removes its writer in one, before the coroutine
        # resumed makes a transport of that socket).
        relay = _Relay(waited.get_loop())
        waited.add_done_callback(relay.fire)
        while not relay.fired:
            try:
                yield relay.stand_in()
            except asyncio.CancelledError as exc:
                self.cancelled = exc


class _Relay:
    """The stand-ins a :class:`_ToTheEnd` waits on in turn for one future, and whether
    that future's done-callback (:meth:`fire`) ran: it completes the current stand-in."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._current: asyncio.Future[None] | None = None
        self.fired = False

    def stand_in(self) -> asyncio.Future[None]:
        """A new stand-in to wait on (the previous one was cancelled)."""
        future = self._current = self._loop.create_future()
        future._asyncio_future_blocking = True
        return future

    def fire(self, _: object) -> None:
        self.fired = True
        if self._current is not None and not self._current.done():
            self._current.set_result(None)


async def pooled_connection(conn: AsyncConnection) -> PoolProxiedConnection:
    """``await conn.get_raw_connection()``, without its greenlet when ``conn`` is live."""
    sync = conn.sync_connection
    if sync is not None and not (sync.invalidated or sync.closed):
        # A live connection hands its pooled connection over without IO; only
        # reconnecting one needs the greenlet ``get_raw_connection`` spawns.
        return sync.connection
    return await conn.get_raw_connection()
