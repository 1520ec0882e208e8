"""Notifications that wait for the caller's COMMIT.

    notes = buffer_for_transaction(session, publisher)
        # the buffer attached to the caller's AsyncSession/AsyncConnection
        # transaction: sent (see notifications.send_later) after COMMIT,
        # dropped on rollback; entries recorded inside a savepoint that rolls
        # back are dropped. Several calls in one transaction share one buffer,
        # so a transaction costs one notify round trip.

Call ``buffer_for_transaction`` right before each write (as the client does):
the call notes which savepoint is current, so that the entries the write
records can be dropped with that savepoint.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, MutableSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session as SyncSession

from state_adapters.notifications import NotificationBuffer, Publisher, send_later, track_flush

if TYPE_CHECKING:
    from sqlalchemy.engine import (
        Connection,
        Engine,
        ExceptionContext,
        NestedTransaction,
        RootTransaction,
    )
    from sqlalchemy.orm import Session, SessionTransaction

logger = logging.getLogger(__name__)

_COMMIT_WAIT_LIMIT = 60.0
"""Seconds a connection's after-commit flush waits for the COMMIT to finish."""

# -- after-commit flushing -------------------------------------------------------------


class CommitSink(abc.ABC):
    """Takes the notifications of a synchronous transaction (``SyncClient``), which
    has no event loop to send them from."""

    @abc.abstractmethod
    def after_commit(self, notes: NotificationBuffer, outcome: Callable[[], bool | None]) -> None:
        """``notes`` are owed once the COMMIT succeeded: ``outcome()`` is ``None`` while
        it is in flight, then whether it succeeded. Called on the committing thread:
        must not block."""


Destination = Publisher | CommitSink
"""Where a transaction's notifications go once it committed."""


def _schedule_flush(buffers: dict[Destination, NotificationBuffer]) -> None:
    if not any(buffers.values()):
        return
    if _hand_to_sinks(buffers, _committed, "after") is not None:
        _send_all(buffers)


def _hand_to_sinks(
    buffers: dict[Destination, NotificationBuffer],
    outcome: Callable[[], bool | None],
    when: str,
) -> asyncio.AbstractEventLoop | None:
    """Give the synchronous destinations their buffers (taken out of ``buffers``); the
    running loop to send the rest from, or ``None`` when nothing is left to send or
    there is no loop (``when``: the moment of the COMMIT this runs at, for the log)."""
    for sink, buffer in _sinks(buffers):
        sink.after_commit(buffer, outcome)
    if not any(buffers.values()):
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        logger.warning("no running event loop %s COMMIT; notifications dropped", when)
        return None


def _send_all(buffers: dict[Destination, NotificationBuffer]) -> None:
    for notify, buffer in buffers.items():
        if not isinstance(notify, CommitSink):
            send_later(notify, buffer)


def _sinks(
    buffers: dict[Destination, NotificationBuffer],
) -> list[tuple[CommitSink, NotificationBuffer]]:
    """The synchronous destinations among ``buffers``, taken out of it."""
    sinks = [(d, b) for d, b in buffers.items() if isinstance(d, CommitSink)]
    for sink, _ in sinks:
        del buffers[sink]
    return sinks


def _committed() -> bool:
    return True


@dataclass(eq=False)
class _Tracker:
    """The buffers of the current transaction of one session or connection."""

    buffers: dict[Destination, NotificationBuffer] = field(default_factory=dict)
    committing: _Commit | None = None
    """Connections only: the COMMIT in flight whose notifications wait for it."""
    committed: bool = False
    """Sessions only: the transaction ending committed (``after_commit`` fired)."""

    def buffer(self, notify: Destination, savepoints: list[Any]) -> NotificationBuffer:
        buffer = self.buffers.get(notify)
        if buffer is None:
            buffer = self.buffers[notify] = NotificationBuffer()
        buffer.enter_savepoints(savepoints)
        return buffer

    def take(self) -> dict[Destination, NotificationBuffer]:
        buffers, self.buffers = self.buffers, {}
        return buffers

    def rollback_savepoint(self, savepoint: Any) -> None:
        for buffer in self.buffers.values():
            buffer.rollback_savepoint(savepoint)


_trackers: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()


def buffer_for_transaction(
    session_or_connection: AsyncSession | AsyncConnection | SyncSession | SyncConnection,
    notify: Destination,
) -> NotificationBuffer:
    """The buffer of the caller's current transaction for ``notify``.

    Flushed to ``notify`` by a task on the running loop once the transaction
    has committed (a :class:`CommitSink` gets it on the committing thread instead);
    dropped when it rolls back; entries recorded while a savepoint was innermost are
    dropped if that savepoint rolls back. Synchronous sessions and connections take
    a :class:`CommitSink` only.
    """
    if isinstance(session_or_connection, SyncSession | SyncConnection) and not isinstance(
        notify, CommitSink
    ):
        raise wrong_session(session_or_connection)
    target: object = session_or_connection
    if isinstance(target, AsyncSession):
        target = target.sync_session
    elif isinstance(target, AsyncConnection):
        target = target.sync_connection
        if target is None:
            raise ValueError("the AsyncConnection is not started; use it inside `async with`")
    if isinstance(target, SyncSession):
        tracker = _tracker(target, lambda: _hook_session_class(type(target)))
        return tracker.buffer(notify, _session_savepoints(target))
    if isinstance(target, SyncConnection):
        tracker = _tracker(target, lambda: _hook_engine(target.engine))
        return tracker.buffer(notify, _connection_savepoints(target))
    raise wrong_session(session_or_connection)


def _tracker(session_or_connection: Session | Connection, hook: Callable[[], None]) -> _Tracker:
    """The tracker of this session's or connection's transaction; the first one made
    calls ``hook`` (which makes sure its events are listened to)."""
    tracker = _trackers.get(session_or_connection)
    if tracker is None:
        hook()
        tracker = _trackers[session_or_connection] = _Tracker()
    return tracker


_hooking = threading.Lock()


def _listen_once(
    target: Any,
    covered_by: tuple[Any, ...],
    hooked: MutableSet[Any],
    listeners: Mapping[str, Callable[..., Any]],
) -> None:
    """Add ``listeners`` to ``target`` and note it in ``hooked``, unless one of
    ``covered_by`` (``target`` and whatever it takes listeners from) is there already;
    once per process, even when threads race to it."""
    if any(c in hooked for c in covered_by):
        return
    with _hooking:
        if any(c in hooked for c in covered_by):
            return
        for name, listener in listeners.items():
            event.listen(target, name, listener)
        hooked.add(target)


def wrong_session(session: object) -> TypeError:
    """The error for a ``session=`` the async client cannot write in."""
    if isinstance(session, SyncSession | SyncConnection):
        return TypeError(
            f"session is a synchronous {type(session).__name__}: Client writes in an "
            "AsyncSession or AsyncConnection; synchronous applications use "
            "queuert_notify.SyncClient"
        )
    return TypeError(
        f"session must be an AsyncSession or AsyncConnection, got {type(session).__name__}"
    )


# -- ORM sessions ----------------------------------------------------------------------


def _session_savepoints(session: Session) -> list[SessionTransaction]:
    chain: list[SessionTransaction] = []
    transaction = session.get_nested_transaction()
    while transaction is not None and transaction.nested:
        chain.append(transaction)
        transaction = transaction.parent
    return chain[::-1]


_hooked_session_classes: set[type[Session]] = set()


def _hook_session_class(cls: type[Session]) -> None:
    """Listen to the session events of ``cls`` (and its subclasses) once per process.

    Listeners on one session object cost more than the start they serve (SQLAlchemy's
    event registry keeps weak references per listener): a request's session would pay
    three per transaction. The class's listeners fire for every session of the class;
    they look the session up among the tracked ones and return at once when it is not
    (a dictionary lookup per transaction of the application's other sessions)."""
    listeners: dict[str, Callable[..., Any]] = {
        "after_commit": _session_after_commit,
        "after_transaction_end": _session_after_transaction_end,
        "after_soft_rollback": _session_after_soft_rollback,
    }
    _listen_once(cls, cls.__mro__, _hooked_session_classes, listeners)


# Session events fire in this order: a commit runs after_commit then
# after_transaction_end; a rollback runs after_transaction_end then
# after_soft_rollback. A released savepoint also fires after_commit, so
# only the end of the root transaction decides.


def _session_after_commit(session: Session) -> None:
    tracker = _trackers.get(session)
    if tracker is not None:
        tracker.committed = True


def _session_after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    tracker = _trackers.get(session)
    if tracker is None:
        return
    committed, tracker.committed = tracker.committed, False
    if transaction.nested or transaction.parent is not None:
        return
    buffers = tracker.take()
    if committed:
        _schedule_flush(buffers)


def _session_after_soft_rollback(session: Session, transaction: SessionTransaction) -> None:
    tracker = _trackers.get(session)
    if tracker is not None and transaction.nested:
        tracker.rollback_savepoint(transaction)


# -- Core connections ------------------------------------------------------------------


def _connection_savepoints(connection: Connection) -> list[NestedTransaction]:
    chain: list[NestedTransaction] = []
    nested = connection.get_nested_transaction()
    while nested is not None:
        chain.append(nested)
        # Core keeps the enclosing savepoint only as a private attribute.
        nested = getattr(nested, "_previous_nested", None)
    return chain[::-1]


@dataclass(eq=False)
class _Commit:
    """A connection's COMMIT in flight and whether the database refused it."""

    transaction: RootTransaction
    failed: bool = False

    def outcome(self) -> bool | None:
        """``None`` while the COMMIT is in flight, then whether it succeeded."""
        if self.transaction.is_active and not self.failed:
            return None
        return not self.failed


_hooked_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _hook_engine(engine: Engine) -> None:
    """Listen to the transaction events of ``engine``'s connections once per engine
    (see :func:`_hook_session_class` for why not per connection). Core has no
    after-commit event: the "commit" event fires before COMMIT is sent, so the flush
    task first waits for that COMMIT to finish, and sends only if no error was reported
    for it meanwhile (``handle_error`` fires while the transaction is still active,
    before the COMMIT call returns). Every handler may fire twice for one event (an
    engine with execution options and the engine under it both hooked): the second
    finds the buffers already taken."""
    listeners: dict[str, Callable[..., Any]] = {
        "commit": _connection_commit,
        "rollback": _connection_rollback,
        "rollback_savepoint": _connection_rollback_savepoint,
        "handle_error": _on_database_error,
    }
    _listen_once(engine, (engine,), _hooked_engines, listeners)


def _connection_commit(conn: Connection) -> None:
    tracker = _trackers.get(conn)
    if tracker is None:
        return
    transaction = conn.get_transaction()
    buffers = tracker.take()
    if transaction is None or not any(buffers.values()):
        return
    commit = tracker.committing = _Commit(transaction)
    loop = _hand_to_sinks(buffers, commit.outcome, "at")
    if loop is not None:
        task = loop.create_task(
            _flush_after_commit(commit, buffers), name="queuert-after-commit-flush"
        )
        track_flush(task)


def _connection_rollback(conn: Connection) -> None:
    tracker = _trackers.get(conn)
    if tracker is not None:
        tracker.take()


def _connection_rollback_savepoint(conn: Connection, _name: str, _context: Any) -> None:
    # Fired before ROLLBACK TO SAVEPOINT, while the savepoint rolled back is still
    # the innermost one.
    tracker = _trackers.get(conn)
    nested = conn.get_nested_transaction()
    if tracker is not None and nested is not None:
        tracker.rollback_savepoint(nested)


def _on_database_error(context: ExceptionContext) -> None:
    tracker = _trackers.get(context.connection) if context.connection is not None else None
    commit = tracker.committing if tracker is not None else None
    if commit is not None and commit.transaction.is_active:
        commit.failed = True


async def _flush_after_commit(
    commit: _Commit, buffers: dict[Destination, NotificationBuffer]
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _COMMIT_WAIT_LIMIT
    # The COMMIT is in flight on this loop and ends within a round trip. Core
    # offers no event after it, so look at the transaction every millisecond.
    while commit.transaction.is_active and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    if commit.failed or commit.transaction.is_active:
        logger.warning("COMMIT did not succeed; notifications dropped")
        return
    _send_all(buffers)
