"""How ``SyncClient`` hands a committed write's notifications to each shipped notify
adapter, with blocking clients and without an event loop.

=====================  ==================================================================
notify adapter         what a synchronous write does
=====================  ==================================================================
``None``, Noop         nothing: workers find the jobs on their next poll
Postgres               NOTIFY inside the caller's transaction (delivered by its COMMIT)
Redis (one server     after COMMIT, the adapter's script and (S)PUBLISHes, one round
or a cluster)          trip (on a cluster: one script per hash slot, all sent at once),
                       from a sender thread (a slow Redis never holds up the caller)
NATS, in-process       refused with ``ConfigurationError``: their clients live on an
                       event loop (use Redis or Postgres, or ``notify=None``)
=====================  ==================================================================
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Connection

from queuert_notify.errors import ConfigurationError
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter
from state_adapters.notifications import PUBLISH_WARNING_INTERVAL, NotificationBuffer
from state_adapters.outage_log import OutageLog
from state_adapters.sync.state import Announcer

if TYPE_CHECKING:
    from queuert_notify.notify.postgres import PostgresNotifyAdapter

logger = logging.getLogger(__name__)

_COMMIT_WAIT_LIMIT = 60.0
"""Seconds the sender waits for a Core connection's COMMIT in flight to finish."""


class BlockingPublisher(Protocol):
    """Sends a committed write's notifications through a notify adapter's wire layout
    with a blocking client (``RedisNotifyAdapter.blocking_publisher()``)."""

    def publish(self, notes: NotificationBuffer) -> None: ...

    def close(self) -> None: ...


def announcer_for(notify: NotifyAdapter | None) -> Announcer:
    """The announcer for ``notify`` (see the module's table); raises
    ``ConfigurationError`` for an adapter a synchronous client cannot publish through."""
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

    if notify is None or isinstance(notify, NoopNotifyAdapter):
        return Announcer()
    if isinstance(notify, RedisNotifyAdapter):
        return PublishAfterCommit(notify.blocking_publisher())
    # Imported last: it needs psycopg 3, which a process on psycopg2 may not have.
    from queuert_notify.notify.postgres import PostgresNotifyAdapter

    if isinstance(notify, PostgresNotifyAdapter):
        return NotifyInTransaction(notify)
    raise ConfigurationError(
        f"SyncClient cannot publish through {type(notify).__name__}: its client runs on an "
        "event loop. Use RedisNotifyAdapter or PostgresNotifyAdapter, or notify=None "
        "(workers find the jobs on their next poll)"
    )


class NotifyInTransaction(Announcer):
    """Postgres: the notifications are NOTIFYs of the write's own transaction."""

    def __init__(self, notify: PostgresNotifyAdapter) -> None:
        self._notify = notify

    def in_transaction(self, connection: Connection, notes: NotificationBuffer) -> None:
        self._notify.notify_in_sync_transaction(connection, notes)


class PublishAfterCommit(Announcer):
    """Redis (one server or a cluster): committed notifications are published by one
    sender thread, in commit order; what commits while a publish is in flight goes out
    merged in the next round trip. ``close()`` sends what is left, waiting at most
    ``limit`` seconds."""

    def __init__(self, publisher: BlockingPublisher) -> None:
        self._publisher = publisher
        self._queue: queue.SimpleQueue[tuple[NotificationBuffer, Callable[[], bool | None]] | None]
        self._queue = queue.SimpleQueue()
        self._outage = OutageLog(
            logger, "sending a notification", interval=PUBLISH_WARNING_INTERVAL, tracebacks=False
        )
        self._thread = threading.Thread(target=self._run, name="queuert-sync-sender", daemon=True)
        self._thread.start()

    def after_commit(self, notes: NotificationBuffer, outcome: Callable[[], bool | None]) -> None:
        if notes:
            self._queue.put((notes, outcome))

    def close(self, limit: float) -> None:
        self._queue.put(None)
        self._thread.join(limit)
        if self._thread.is_alive():
            logger.warning("notifications not sent within %.1fs of close(); workers poll", limit)
        else:
            self._publisher.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = NotificationBuffer()
            for item in self._waiting():
                if item is None:
                    stopping = True
                    break
                notes, outcome = item
                if _committed(outcome):
                    batch.absorb(notes)
            if batch:
                self._publish(batch)

    def _waiting(
        self,
    ) -> Iterator[tuple[NotificationBuffer, Callable[[], bool | None]] | None]:
        """The next item (waiting for it), then whatever queued meanwhile."""
        yield self._queue.get()
        while not self._queue.empty():
            yield self._queue.get()

    def _publish(self, batch: NotificationBuffer) -> None:
        try:
            self._publisher.publish(batch)
        except Exception:
            self._outage.failed("workers will find the change on their next poll")
        else:
            self._outage.succeeded()


def _committed(outcome: Callable[[], bool | None]) -> bool:
    """Whether the COMMIT succeeded, waiting for one in flight on the caller's thread
    (a Core connection's COMMIT is announced before it is sent)."""
    deadline = time.monotonic() + _COMMIT_WAIT_LIMIT
    committed = outcome()
    while committed is None and time.monotonic() < deadline:
        time.sleep(0.001)
        committed = outcome()
    return bool(committed)
