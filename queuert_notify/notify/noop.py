"""The adapter that delivers nothing: workers rely on their polling timer alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.payloads import check_count
from queuert_notify.notify.protocol import (
    ConnectOnEnter,
    JobIdCallback,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)


async def _nothing_to_undo() -> None:
    """The unsubscribe of a registration that holds nothing."""


class NoopNotifyAdapter(ConnectOnEnter):
    """Publishes nowhere and never calls a listener; every wake hint is granted.

    Guarantees: every call succeeds while open and costs nothing;
    ``consume_wake_hint`` always returns True (no budget is kept, so nobody
    is held back); after ``close()`` every call raises
    :class:`~queuert_notify.errors.NotifyAdapterClosedError`. Latency is the
    worker's ``poll_interval``.
    """

    def __init__(self) -> None:
        self._closed = False

    async def connect(self) -> None:
        """Nothing to connect; raises if the adapter was closed."""
        self._check_open()

    async def close(self) -> None:
        """Idempotent."""
        self._closed = True

    async def notify_job_scheduled(self, type_name: str) -> None:
        self._check_open()

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        self._check_open()
        return _nothing_to_undo

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        self._check_open()
        check_count(count)

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Always True: without a budget, waking is the safe answer."""
        self._check_open()
        return True

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        self._check_open()
        for count in counts.values():
            check_count(count)

    async def notify_chain_completed(self, chain_id: str) -> None:
        self._check_open()

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check_open()
        return _nothing_to_undo

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        self._check_open()

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check_open()
        return _nothing_to_undo

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        self._check_open()
        return _nothing_to_undo

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Accepted for the protocol; there is no connection to lose."""
        self._check_open()
        return _nothing_to_undo

    def _check_open(self) -> None:
        if self._closed:
            raise NotifyAdapterClosedError("this NoopNotifyAdapter is closed; create a new adapter")
