"""The notifications a state change owes, and their delivery once it has committed.

Contract used by the client, the worker and the state adapter::

    notes = NotificationBuffer()
    notes.job_scheduled("send-email", 2); notes.chain_completed(cid); notes.ownership_lost(jid)
    await notes.flush(publisher)       # one notify_jobs_scheduled call + the others, then empty
    send_later(publisher, notes)       # sent on the publisher's sender task, in commit order
    await wait_for_notifications()     # every committed change's notifications were sent

A ``Publisher`` is anything with the three notify methods below: every
``queuert_notify`` notify adapter is one. One that also has
``notify_signals(chain_ids, job_ids)`` (what ``notify_chain_completed`` for each chain
then ``notify_job_ownership_lost`` for each job send, in one transport call) gets those
in one call per flush. Transactions of the caller's own attach
their buffer with :func:`state_adapters.transactions.after_commit.buffer_for_transaction`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any, Protocol

from state_adapters.outage_log import OutageLog

logger = logging.getLogger(__name__)

_SCHEDULED = "scheduled"
_CHAIN_COMPLETED = "chain_completed"
_OWNERSHIP_LOST = "ownership_lost"


class Publisher(Protocol):
    """Where notifications go: the part of a notify adapter the state layer uses."""

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None: ...

    async def notify_chain_completed(self, chain_id: str) -> None: ...

    async def notify_job_ownership_lost(self, job_id: str) -> None: ...


_flush_tasks: set[asyncio.Task[None]] = set()


def track_flush(task: asyncio.Task[None]) -> None:
    """Count ``task`` (an after-commit flush) among what :func:`wait_for_notifications`
    waits for."""
    _flush_tasks.add(task)
    task.add_done_callback(_flush_tasks.discard)


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

    async def flush(self, notify: Publisher) -> None:
        """Send everything (one ``notify_jobs_scheduled`` call for all types, then the
        chain completions and ownership losses, started together in that order) and
        empty the buffer."""
        counts, chains, jobs = self.scheduled, self.completed_chains, self.lost_jobs
        self.clear()
        if counts:
            await _send(notify, "notify_jobs_scheduled", notify.notify_jobs_scheduled(counts))
        if not chains and not jobs:
            return
        signals = getattr(notify, "notify_signals", None)
        if signals is not None:
            # One call for all: no task, no future per chain completed.
            await _send(notify, "notify_signals", signals(chains, jobs))
            return
        # Started together, in order: an adapter that batches what is published in one
        # turn of the event loop (the shipped transports do) sends them in one round
        # trip instead of one per chain.
        await asyncio.gather(
            *(
                _send(notify, "notify_chain_completed", notify.notify_chain_completed(chain_id))
                for chain_id in chains
            ),
            *(
                _send(notify, "notify_job_ownership_lost", notify.notify_job_ownership_lost(job_id))
                for job_id in jobs
            ),
        )

    # -- savepoints (used by the transaction hooks) ------------------------------------

    def enter_savepoints(self, active: Iterable[Any]) -> None:
        """Note the savepoints active now (outermost first): entries recorded from
        here on belong to the innermost; marks of savepoints that ended are dropped."""
        live = list(active)
        self._marks = [(sp, at) for sp, at in self._marks if any(sp is a for a in live)]
        known = [sp for sp, _ in self._marks]
        for savepoint in live:
            if not any(savepoint is k for k in known):
                self._marks.append((savepoint, len(self._entries)))

    def rollback_savepoint(self, savepoint: Any) -> None:
        """Drop the entries recorded since ``savepoint`` was first seen."""
        for index, (sp, at) in enumerate(self._marks):
            if sp is savepoint:
                del self._entries[at:]
                del self._marks[index:]
                return


_outages: weakref.WeakKeyDictionary[Publisher, OutageLog] = weakref.WeakKeyDictionary()
PUBLISH_WARNING_INTERVAL = 60.0
"""While publishes keep failing, one WARNING line (the error's first line, no traceback)
per this many seconds; the outage's end is one INFO line."""


def _publish_outage() -> OutageLog:
    return OutageLog(
        logger, "sending a notification", interval=PUBLISH_WARNING_INTERVAL, tracebacks=False
    )


_outage_of_unhashable = _publish_outage()
_POLL_INSTEAD = "workers will find the change on their next poll"


async def _send(notify: Publisher, what: str, call: Any) -> None:
    try:
        outage = _outages.get(notify)
        if outage is None:
            outage = _outages[notify] = _publish_outage()
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

    def __init__(self, notify: Publisher) -> None:
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


_senders: weakref.WeakKeyDictionary[Publisher, _Sender] = weakref.WeakKeyDictionary()
_sender_tasks: set[asyncio.Task[None]] = set()


def send_later(notify: Publisher, notes: NotificationBuffer) -> None:
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
