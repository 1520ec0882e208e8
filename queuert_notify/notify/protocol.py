"""The notify seam: how job state changes reach sleeping workers and waiters.

Notifications are hints. Correctness never depends on delivery: SQL row locks
decide who owns a job and workers keep a polling timer, so a lost, duplicated
or malformed notification may cost latency, never a job.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, Self, runtime_checkable

Unsubscribe = Callable[[], Awaitable[None]]
"""Removes one registration. Idempotent, and safe to call after ``close()``."""

TypeNameCallback = Callable[[str], object]
"""Called with the job type name; a plain function or a coroutine function."""

SignalCallback = Callable[[], object]
"""Called with no arguments; a plain function or a coroutine function."""

JobIdCallback = Callable[[str], object]
"""Called with a job id; a plain function or a coroutine function."""

HINT_TTL_SECONDS = 60
"""A wake budget expires this long after the last ``provide_wake_hint``."""


class ConnectOnEnter(ABC):
    """The adapters' ``async with``: entering connects, leaving closes (also when the
    body raised)."""

    @abstractmethod
    async def connect(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None:
        """Nothing to acknowledge: wakes of this transport are not durable (see
        :meth:`NotifyAdapter.acknowledge_wakes`)."""
        return None

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        """``None``: this transport has no one channel that carries every job's loss, so
        a worker listens per job instead (see
        :meth:`NotifyAdapter.listen_every_job_ownership_lost`)."""
        return None

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


@runtime_checkable
class NotifyAdapter(Protocol):
    """Publishes and delivers the three notifications and keeps wake budgets.

    Every adapter is an async context manager; ``connect()`` is idempotent and
    ``close()`` is idempotent. After ``close()`` the notify/listen methods raise
    :class:`~queuert_notify.errors.NotifyAdapterClosedError`. An exception
    raised by one callback never affects another callback or the subscription.
    """

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> NotifyAdapter: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def notify_job_scheduled(self, type_name: str) -> None: ...

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe: ...

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the wake budget of ``type_name`` (budgets add up;
        the budget expires 60 s after the last provide)."""
        ...

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Atomically take one unit of budget. True when taken or when no
        budget exists (wake rather than miss); False only when a budget exists
        and is exhausted."""
        ...

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """``provide_wake_hint`` + ``notify_job_scheduled`` for every type, in
        as few round trips as the transport allows."""
        ...

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None:
        """Called by a worker after each claim pass with the ``callback`` it gave
        ``listen_job_scheduled``: every wake it consumed since the last call is used
        (an adapter with durable wakes, like ``RedisNotifyAdapter(wake="lists")``,
        acknowledges them now; until then a crash gives them back), and that listener
        has ``free_slots`` free (such an adapter takes no more wakes for it than that).
        Adapters whose wakes are fire-and-forget do nothing (``ConnectOnEnter``)."""
        ...

    async def notify_chain_completed(self, chain_id: str) -> None: ...

    async def listen_chain_completed(
        self, chain_id: str, callback: SignalCallback
    ) -> Unsubscribe: ...

    async def notify_job_ownership_lost(self, job_id: str) -> None: ...

    async def listen_job_ownership_lost(
        self, job_id: str, callback: SignalCallback
    ) -> Unsubscribe: ...

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        """Call ``callback(job_id)`` for every later ``notify_job_ownership_lost``, of any
        job, as :meth:`listen_job_ownership_lost` would call that job's listeners; or
        return ``None`` when the transport has no one channel every job's loss passes
        through (then listen per job). A worker listens once, for all its runs, instead
        of once per run (``ConnectOnEnter`` returns ``None``)."""
        ...

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Register ``callback`` to run after a lost subscription is restored
        (messages may have been missed: poll now)."""
        ...
