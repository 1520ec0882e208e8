"""Notifications and wake budgets inside one Python process (tests, the embedded demo)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.payloads import check_count, encode_payload
from queuert_notify.notify.protocol import (
    HINT_TTL_SECONDS,
    ConnectOnEnter,
    JobIdCallback,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)
from queuert_notify.notify.shared_listener import ANY_PAYLOAD, SharedListener

_SCHEDULED = "sched"
_CHAIN_COMPLETED = "chainc"
_OWNERSHIP_LOST = "owls"
_EVERY_OWNERSHIP_LOST = "owls of every job"


async def _no_transport(channel: str) -> None:
    """In memory there is no transport subscription to open or drop."""


async def _nothing_to_undo() -> None:
    """The unsubscribe of a registration that holds nothing."""


class InProcessNotifyAdapter(ConnectOnEnter):
    """Delivers every notification to the listeners of this adapter, in this process.

    Guarantees: a notification reaches every matching listener registered
    before the ``notify_*`` call, before that call returns; wake budgets are
    honoured exactly (atomic on one event loop) and expire ``HINT_TTL_SECONDS``
    after the last provide. Nothing crosses process boundaries: share one
    instance between the client and the workers of a process.

    ``clock`` (monotonic seconds) exists so tests can move time forward.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._listener = SharedListener(_no_transport, _no_transport)
        # type name -> (remaining budget, monotonic deadline)
        self._budgets: dict[str, tuple[int, float]] = {}
        self._closed = False

    async def connect(self) -> None:
        """Nothing to connect; raises if the adapter was closed."""
        self._check_open()

    async def close(self) -> None:
        """Drop every listener and budget; idempotent."""
        self._closed = True
        self._budgets.clear()
        await self._listener.dispose()

    async def notify_job_scheduled(self, type_name: str) -> None:
        self._check_open()
        encode_payload("type name", type_name)
        self._listener.dispatch(_SCHEDULED, type_name, type_name)

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        self._check_open()
        return await self._listener.add(_SCHEDULED, type_names, callback)

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the budget of ``type_name`` and restart its 60 s expiry."""
        self._check_open()
        check_count(count)
        encode_payload("type name", type_name)
        if count == 0:
            # A zero budget would make consumers return False: no jobs, no change.
            return
        now = self._clock()
        remaining = self._live_budget(type_name, now) or 0
        self._budgets[type_name] = (remaining + count, now + HINT_TTL_SECONDS)

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Take one unit; True when taken or when no live budget exists."""
        self._check_open()
        now = self._clock()
        remaining = self._live_budget(type_name, now)
        if remaining is None:
            return True
        if remaining == 0:
            return False
        _, deadline = self._budgets[type_name]
        self._budgets[type_name] = (remaining - 1, deadline)
        return True

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Provide every budget first, then wake, so woken listeners find their budget."""
        self._check_open()
        # Every name and count is checked before any budget changes.
        for type_name, count in counts.items():
            check_count(count)
            encode_payload("type name", type_name)
        for type_name, count in counts.items():
            await self.provide_wake_hint(type_name, count)
        for type_name, count in counts.items():
            if count > 0:
                self._listener.dispatch(_SCHEDULED, type_name, type_name)

    async def notify_chain_completed(self, chain_id: str) -> None:
        self._check_open()
        encode_payload("chain id", chain_id)
        self._listener.dispatch(_CHAIN_COMPLETED, chain_id)

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check_open()
        return await self._listener.add(_CHAIN_COMPLETED, [chain_id], callback)

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        self._check_open()
        encode_payload("job id", job_id)
        self._listener.dispatch(_OWNERSHIP_LOST, job_id)
        self._listener.dispatch(_EVERY_OWNERSHIP_LOST, job_id, job_id)

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check_open()
        return await self._listener.add(_OWNERSHIP_LOST, [job_id], callback)

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        self._check_open()
        return await self._listener.add(_EVERY_OWNERSHIP_LOST, [ANY_PAYLOAD], callback)

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Accepted for the protocol; an in-memory adapter never loses its subscriptions."""
        self._check_open()
        return _nothing_to_undo

    def _live_budget(self, type_name: str, now: float) -> int | None:
        """The remaining budget of ``type_name``, or None when none exists or it expired."""
        entry = self._budgets.get(type_name)
        if entry is None:
            return None
        remaining, deadline = entry
        if now >= deadline:
            del self._budgets[type_name]
            return None
        return remaining

    def _check_open(self) -> None:
        if self._closed:
            raise NotifyAdapterClosedError(
                "this InProcessNotifyAdapter is closed; create a new adapter"
            )
