"""After-commit delivery of the notifications a state change implies.

Contract used by the client, worker and state adapters::

    notes = NotificationBuffer()
    notes.job_scheduled("send-email", 2); notes.chain_completed(cid); notes.ownership_lost(jid)
    await notes.flush(notify)          # one notify_jobs_scheduled call + the others, then empty

    notes = buffer_for_transaction(session, notify)
        # the buffer attached to the caller's AsyncSession/AsyncConnection
        # transaction: flushed (scheduled as a task on the loop) after COMMIT,
        # dropped on rollback; entries recorded inside a savepoint that rolls
        # back are dropped. Several calls in one transaction share one buffer,
        # so a transaction costs one notify round trip.

    send_later(notify, notes)          # sent on the adapter's sender task, in commit order
    await wait_for_notifications()     # every committed change's notifications were sent

Call ``buffer_for_transaction`` right before each write (as the client does):
the call notes which savepoint is current, so that the entries the write
records can be dropped with that savepoint.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from queuert_notify.outage_log import OutageLog

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, ExceptionContext, NestedTransaction, RootTransaction
    from sqlalchemy.orm import Session, SessionTransaction

    from queuert_notify.notify.protocol import NotifyAdapter

logger = logging.getLogger(__name__)

_SCHEDULED = "scheduled"
_CHAIN_COMPLETED = "chain_completed"
_OWNERSHIP_LOST = "ownership_lost"
_COMMIT_WAIT_LIMIT = 60.0
"""Seconds a connection's after-commit flush waits for the COMMIT to finish."""


class NotificationBuffer:
    """Notifications owed for changes that are not committed yet.

    Invariant: entries are only ever sent by :meth:`flush`, which sends each
    kind at most once per flush (scheduled counts summed per type, chain and
    job ids de-duplicated) and leaves the buffer empty. Sending is best effort:
    notifications are hints, so a transport error is logged, never raised.
    """

    __slots__ = ("_entries", "_marks")

    def __init__(self) -> None:
        self._entries: list[tuple[str, str, int]] = []
        # (savepoint object, number of entries when it was first seen)
        self._marks: list[tuple[Any, int]] = []

    def job_scheduled(self, type_name: str, count: int = 1) -> None:
        """``count`` jobs of ``type_name`` became pending (now or at a later time)."""
        if count > 0:
            self._entries.append((_SCHEDULED, type_name, count))

    def chain_completed(self, chain_id: str) -> None:
        """The chain reached a final status (completed, failed or cancelled)."""
        self._entries.append((_CHAIN_COMPLETED, chain_id, 1))

    def ownership_lost(self, job_id: str) -> None:
        """The worker running this job no longer owns it."""
        self._entries.append((_OWNERSHIP_LOST, job_id, 1))

    def absorb(self, other: NotificationBuffer) -> None:
        """Move every entry of ``other`` into this buffer (``other`` is left empty)."""
        self._entries.extend(other._entries)
        other.clear()

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._marks.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def compact(self) -> None:
        """Fold the entries into one per type (counts summed) and one per id: what
        :meth:`flush` would send stays the same."""
        counts, chains, jobs = self.scheduled, self.completed_chains, self.lost_jobs
        self.clear()
        self._entries.extend((_SCHEDULED, key, count) for key, count in counts.items())
        self._entries.extend((_CHAIN_COMPLETED, key, 1) for key in chains)
        self._entries.extend((_OWNERSHIP_LOST, key, 1) for key in jobs)

    @property
    def scheduled(self) -> dict[str, int]:
        """Jobs that became pending, summed per type name."""
        counts: dict[str, int] = {}
        for kind, key, count in self._entries:
            if kind == _SCHEDULED:
                counts[key] = counts.get(key, 0) + count
        return counts

    @property
    def completed_chains(self) -> list[str]:
        """Chains that reached a final status, in order, without repeats."""
        return self._keys(_CHAIN_COMPLETED)

    @property
    def lost_jobs(self) -> list[str]:
        """Jobs whose worker lost ownership, in order, without repeats."""
        return self._keys(_OWNERSHIP_LOST)

    def _keys(self, kind: str) -> list[str]:
        return list(dict.fromkeys(key for k, key, _ in self._entries if k == kind))

    async def flush(self, notify: NotifyAdapter) -> None:
        """Send everything (one ``notify_jobs_scheduled`` call for all types, then
        chain completions, then ownership losses) and empty the buffer."""
        counts, chains, jobs = self.scheduled, self.completed_chains, self.lost_jobs
        self.clear()
        if counts:
            await _send(notify, "notify_jobs_scheduled", notify.notify_jobs_scheduled(counts))
        for chain_id in chains:
            await _send(notify, "notify_chain_completed", notify.notify_chain_completed(chain_id))
        for job_id in jobs:
            await _send(
                notify, "notify_job_ownership_lost", notify.notify_job_ownership_lost(job_id)
            )

    # -- savepoints (used by the transaction hooks) ------------------------------------

    def _enter_savepoints(self, active: Iterable[Any]) -> None:
        """Note the savepoints active now (outermost first): entries recorded from
        here on belong to the innermost; marks of savepoints that ended are dropped."""
        live = list(active)
        self._marks = [(sp, at) for sp, at in self._marks if any(sp is a for a in live)]
        known = [sp for sp, _ in self._marks]
        for savepoint in live:
            if not any(savepoint is k for k in known):
                self._marks.append((savepoint, len(self._entries)))

    def _rollback_savepoint(self, savepoint: Any) -> None:
        """Drop the entries recorded since ``savepoint`` was first seen."""
        for index, (sp, at) in enumerate(self._marks):
            if sp is savepoint:
                del self._entries[at:]
                del self._marks[index:]
                return


_outages: weakref.WeakKeyDictionary[NotifyAdapter, OutageLog] = weakref.WeakKeyDictionary()
_outage_of_unhashable = OutageLog(logger, "sending a notification")
_POLL_INSTEAD = "workers will find the change on their next poll"


async def _send(notify: NotifyAdapter, what: str, call: Any) -> None:
    try:
        outage = _outages.get(notify)
        if outage is None:
            outage = _outages[notify] = OutageLog(logger, "sending a notification")
    except TypeError:  # an adapter that cannot be hashed or weakly referenced
        outage = _outage_of_unhashable
    try:
        await call
    except Exception:
        outage.failed(_POLL_INSTEAD, notification=what)
    else:
        outage.succeeded()


# -- sending off the caller's path -----------------------------------------------------

SHUTDOWN_FLUSH_LIMIT = 1.0
"""Seconds a sender cancelled at shutdown (``asyncio.run`` ending with a client left
open) still spends sending what committed transactions owe, so that a short script's
last wakeups are not lost."""
_MAX_PENDING_ENTRIES = 10_000
"""Above this many entries a sender's backlog is compacted (counts summed per type,
ids de-duplicated), so an outage of the notify server cannot grow it without bound."""


class _Sender:
    """Sends the notifications of committed changes to one notify adapter, in commit
    order, on a task of its own, so a slow or hung notify server never holds up the
    write that owes them (hints must not hold the application's write path).

    Invariant: at most one send to the adapter is in flight; what commits meanwhile is
    merged into one backlog buffer and sent by the next round trip, so a burst of
    commits costs fewer round trips, never more, and order between rounds is kept.
    """

    def __init__(self, notify: NotifyAdapter) -> None:
        self._notify = notify
        self._backlog = NotificationBuffer()
        self._task: asyncio.Task[None] | None = None

    def send(self, notes: NotificationBuffer) -> None:
        self._backlog.absorb(notes)
        if len(self._backlog) > _MAX_PENDING_ENTRIES:
            self._backlog.compact()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="queuert-notification-sender"
            )
            _sender_tasks.add(self._task)
            self._task.add_done_callback(_sender_tasks.discard)

    async def _run(self) -> None:
        batch = NotificationBuffer()
        try:
            while self._backlog:
                batch.absorb(self._backlog)
                await batch.flush(self._notify)
        except asyncio.CancelledError:
            # Shutting down (asyncio.run cancels what is left): one bounded last try.
            batch.absorb(self._backlog)
            if batch:
                with suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(batch.flush(self._notify), SHUTDOWN_FLUSH_LIMIT)
            raise


_senders: weakref.WeakKeyDictionary[NotifyAdapter, _Sender] = weakref.WeakKeyDictionary()
_sender_tasks: set[asyncio.Task[None]] = set()


def send_later(notify: NotifyAdapter, notes: NotificationBuffer) -> None:
    """Send ``notes`` (already committed) to ``notify`` without waiting for it: queued
    behind earlier sends to the same adapter, in order, and empties ``notes``."""
    if not notes:
        return
    try:
        sender = _senders.get(notify)
        if sender is None:
            sender = _senders[notify] = _Sender(notify)
    except TypeError:  # an adapter that cannot be hashed or weakly referenced
        sender = _Sender(notify)
    sender.send(notes)


# -- after-commit flushing -------------------------------------------------------------

_flush_tasks: set[asyncio.Task[None]] = set()


def _schedule_flush(buffers: dict[NotifyAdapter, NotificationBuffer]) -> None:
    if not any(buffers.values()):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        logger.warning("no running event loop after COMMIT; notifications dropped")
        return
    _send_all(buffers)


def _send_all(buffers: dict[NotifyAdapter, NotificationBuffer]) -> None:
    for notify, buffer in buffers.items():
        send_later(notify, buffer)


async def wait_for_notifications(timeout: float | None = None) -> bool:  # noqa: ASYNC109
    """Wait until every notification owed by a committed change so far has been sent
    (or its send failed and was logged); ``timeout`` bounds the wait. True when
    nothing is left to send.

    For tests and shutdown: a ``close()`` that calls this never drops the
    notifications of a transaction that already committed while the notify server
    answers.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    current = asyncio.current_task()

    def pending() -> list[asyncio.Task[None]]:
        return [
            t
            for t in (*_flush_tasks, *_sender_tasks)
            if t.get_loop() is loop and t is not current and not t.done()
        ]

    while tasks := pending():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            return False
        await asyncio.wait(tasks, timeout=left)
    return True


@dataclass(eq=False)
class _Tracker:
    """The buffers of the current transaction of one session or connection."""

    buffers: dict[NotifyAdapter, NotificationBuffer] = field(default_factory=dict)
    committing: _Commit | None = None
    """Connections only: the COMMIT in flight whose notifications wait for it."""

    def buffer(self, notify: NotifyAdapter, savepoints: list[Any]) -> NotificationBuffer:
        buffer = self.buffers.get(notify)
        if buffer is None:
            buffer = self.buffers[notify] = NotificationBuffer()
        buffer._enter_savepoints(savepoints)
        return buffer

    def take(self) -> dict[NotifyAdapter, NotificationBuffer]:
        buffers, self.buffers = self.buffers, {}
        return buffers

    def rollback_savepoint(self, savepoint: Any) -> None:
        for buffer in self.buffers.values():
            buffer._rollback_savepoint(savepoint)


_trackers: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()


def buffer_for_transaction(
    session_or_connection: AsyncSession | AsyncConnection, notify: NotifyAdapter
) -> NotificationBuffer:
    """The buffer of the caller's current transaction for ``notify``.

    Flushed to ``notify`` by a task on the running loop once the transaction
    has committed; dropped when it rolls back; entries recorded while a
    savepoint was innermost are dropped if that savepoint rolls back.
    """
    if isinstance(session_or_connection, AsyncSession):
        session = session_or_connection.sync_session
        tracker = _tracker(session, _hook_session)
        return tracker.buffer(notify, _session_savepoints(session))
    if isinstance(session_or_connection, AsyncConnection):
        connection = session_or_connection.sync_connection
        if connection is None:
            raise ValueError("the AsyncConnection is not started; use it inside `async with`")
        tracker = _tracker(connection, _hook_connection)
        return tracker.buffer(notify, _connection_savepoints(connection))
    raise TypeError(
        "session must be an AsyncSession or AsyncConnection, "
        f"got {type(session_or_connection).__name__}"
    )


def _tracker(target: Any, hook: Any) -> _Tracker:
    tracker = _trackers.get(target)
    if tracker is None:
        tracker = _trackers[target] = _Tracker()
        hook(target, tracker)
    return tracker


# -- ORM sessions ----------------------------------------------------------------------


def _session_savepoints(session: Session) -> list[SessionTransaction]:
    chain: list[SessionTransaction] = []
    transaction = session.get_nested_transaction()
    while transaction is not None and transaction.nested:
        chain.append(transaction)
        transaction = transaction.parent
    return chain[::-1]


def _hook_session(session: Session, tracker: _Tracker) -> None:
    # Session events fire in this order: a commit runs after_commit then
    # after_transaction_end; a rollback runs after_transaction_end then
    # after_soft_rollback. A released savepoint also fires after_commit, so
    # only the end of the root transaction decides.
    committed = False

    def after_commit(_session: Session) -> None:
        nonlocal committed
        committed = True

    def after_transaction_end(_session: Session, transaction: SessionTransaction) -> None:
        nonlocal committed
        if transaction.nested or transaction.parent is not None:
            committed = False
            return
        buffers = tracker.take()
        if committed:
            _schedule_flush(buffers)
        committed = False

    def after_soft_rollback(_session: Session, transaction: SessionTransaction) -> None:
        if transaction.nested:
            tracker.rollback_savepoint(transaction)

    event.listen(session, "after_commit", after_commit)
    event.listen(session, "after_transaction_end", after_transaction_end)
    event.listen(session, "after_soft_rollback", after_soft_rollback)


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


def _hook_connection(connection: Connection, tracker: _Tracker) -> None:
    # Core has no after-commit event: the "commit" event fires before COMMIT is
    # sent, so the flush task first waits for that COMMIT to finish, and sends
    # only if no error was reported for it meanwhile (handle_error fires while
    # the transaction is still active, before the COMMIT call returns).

    def on_commit(conn: Connection) -> None:
        transaction = conn.get_transaction()
        buffers = tracker.take()
        if transaction is None or not any(buffers.values()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            logger.warning("no running event loop at COMMIT; notifications dropped")
            return
        commit = tracker.committing = _Commit(transaction)
        task = loop.create_task(
            _flush_after_commit(commit, buffers), name="queuert-after-commit-flush"
        )
        _flush_tasks.add(task)
        task.add_done_callback(_flush_tasks.discard)

    def on_rollback(_conn: Connection) -> None:
        tracker.take()

    def on_rollback_savepoint(conn: Connection, _name: str, _context: Any) -> None:
        # Fired before ROLLBACK TO SAVEPOINT, while the savepoint rolled back is
        # still the innermost one.
        nested = conn.get_nested_transaction()
        if nested is not None:
            tracker.rollback_savepoint(nested)

    event.listen(connection, "commit", on_commit)
    event.listen(connection, "rollback", on_rollback)
    event.listen(connection, "rollback_savepoint", on_rollback_savepoint)
    # Registered on the dialect (per engine), shared by every hooked connection.
    if not event.contains(connection.engine, "handle_error", _on_database_error):
        event.listen(connection.engine, "handle_error", _on_database_error)


def _on_database_error(context: ExceptionContext) -> None:
    tracker = _trackers.get(context.connection) if context.connection is not None else None
    commit = tracker.committing if tracker is not None else None
    if commit is not None and commit.transaction.is_active:
        commit.failed = True


async def _flush_after_commit(
    commit: _Commit, buffers: dict[NotifyAdapter, NotificationBuffer]
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
