"""What ``RedisNotifyAdapter`` asks of a Redis transport: the seam between the one
adapter class and the two ways of reaching Redis, chosen once at construction
(:class:`~queuert_notify.notify.redis.server.RedisServerTransport` for one server,
:class:`~queuert_notify.notify.redis.cluster.RedisClusterTransport` for a cluster).
mypy checks both against :class:`RedisTransport` where the adapter builds them.

:class:`RedisWakes` is the job-scheduled part alone: what the adapter sends wakes to,
the transport itself or, with ``wake="lists"``,
:class:`~queuert_notify.notify.redis.lists.RedisWakeLists`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from queuert_notify.notify.protocol import (
    JobIdCallback,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)

if TYPE_CHECKING:
    from queuert_notify.notify.redis.lists import RedisWakeLists


class RedisWakes(Protocol):
    """Job-scheduled wakes and their budgets, each method keeping the promise of the
    same method of ``RedisNotifyAdapter``."""

    async def notify_job_scheduled(self, type_name: str) -> None: ...

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe: ...

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None: ...

    async def provide_wake_hint(self, type_name: str, count: int) -> None: ...

    async def consume_wake_hint(self, type_name: str) -> bool: ...

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None: ...


class RedisTransport(RedisWakes, Protocol):
    """A connection to Redis keeping every promise of the same method of
    ``RedisNotifyAdapter`` (the notify contract, plus ``ignored_messages`` and
    ``prefix``); the adapter only forwards to it."""

    @property
    def ignored_messages(self) -> int:
        """Messages on our channels dropped as malformed since construction."""
        ...

    @property
    def prefix(self) -> str:
        """The prefix of every channel and key."""
        ...

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def notify_chain_completed(self, chain_id: str) -> None: ...

    async def notify_signals(self, chain_ids: Sequence[str], job_ids: Sequence[str]) -> None: ...

    async def listen_chain_completed(
        self, chain_id: str, callback: SignalCallback
    ) -> Unsubscribe: ...

    async def notify_job_ownership_lost(self, job_id: str) -> None: ...

    async def listen_job_ownership_lost(
        self, job_id: str, callback: SignalCallback
    ) -> Unsubscribe: ...

    async def listen_every_job_ownership_lost(
        self, callback: JobIdCallback
    ) -> Unsubscribe | None: ...

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe: ...

    def wake_lists(self, consumer_timeout: float) -> RedisWakeLists:
        """The ``wake="lists"`` tokens on the same Redis, sharing the command client."""
        ...


class RedisTransportFactory(Protocol):
    """How the adapter builds a transport: a transport class is one. ``url`` or
    ``client`` (exactly one, checked by the adapter, as is ``prefix``)."""

    def __call__(
        self,
        url: str | None,
        *,
        client: object,
        prefix: str,
        connect_timeout: float,
        close_timeout: float,
    ) -> RedisTransport: ...
