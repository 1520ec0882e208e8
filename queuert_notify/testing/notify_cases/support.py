"""What every notify-adapter conformance case shares: unique names, the recording
listener, the class attributes a subclass sets, and the sentinel round."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import ClassVar

import pytest

from queuert_notify.notify.protocol import NotifyAdapter

PoisonBudget = Callable[[str, str], Awaitable[None]]
"""``poison(type_name, kind)``: see ``NotifyAdapterConformance.poison_wake_budget``."""

ForceReconnect = Callable[[], Awaitable[None]]
"""``force_reconnect()``: see ``NotifyAdapterConformance.force_reconnect``."""


def unique(kind: str) -> str:
    """A name no other test (or earlier run on a shared server) has used."""
    return f"{kind}-{uuid.uuid4().hex[:10]}"


class Recorder:
    """A listener callback that records its calls and lets a test wait for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self._changed = asyncio.Event()

    def __call__(self, *args: object) -> None:
        self.calls.append(args)
        self._changed.set()

    async def wait_for(self, count: int, within: float) -> None:
        """Return once at least ``count`` calls arrived; fail the test after ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                while len(self.calls) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pytest.fail(
                f"expected {count} notification(s) within {within}s, got {len(self.calls)}: "
                f"{self.calls!r}"
            )


class NotifyCases:
    """The class attributes a conformance subclass sets, and the helpers of the cases."""

    delivers: ClassVar[bool] = True
    supports_hints: ClassVar[bool] = True
    wake_per_unit: ClassVar[bool] = False
    delivery_timeout: ClassVar[float] = 5.0
    quiet_period: ClassVar[float] = 0.3

    def _requires_delivery(self) -> None:
        if not self.delivers:
            pytest.skip("this adapter delivers no notifications")

    def _requires_hints(self) -> None:
        if not self.supports_hints:
            pytest.skip("this adapter keeps no wake budgets")

    async def _sentinel_round(self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter) -> None:
        """Publish a fresh message on every channel and wait for all of them, so
        anything published earlier by ``peer_adapter`` has been delivered."""
        name = unique("sentinel")
        rec = Recorder()
        unsubscribes = [
            await adapter.listen_job_scheduled([name], rec),
            await adapter.listen_chain_completed(name, rec),
            await adapter.listen_job_ownership_lost(name, rec),
        ]
        await peer_adapter.notify_job_scheduled(name)
        await peer_adapter.notify_chain_completed(name)
        await peer_adapter.notify_job_ownership_lost(name)
        await rec.wait_for(3, self.delivery_timeout)
        for unsubscribe in unsubscribes:
            await unsubscribe()
