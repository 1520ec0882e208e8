"""Notify-adapter conformance, reconnecting: when the adapter's subscription connection
drops and comes back, ``on_reconnect`` callbacks run (so workers poll), listeners hear
again, and an unsubscribed callback is not called any more.

These cases need the ``force_reconnect`` fixture; adapters without a connection to lose
skip them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress

import pytest

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing.notify_cases.support import (
    ForceReconnect,
    NotifyCases,
    Recorder,
    unique,
)


class ReconnectCases(NotifyCases):
    """Reconnecting: cases every notify adapter with a connection must pass."""

    async def test_on_reconnect_runs_and_listeners_hear_again_after_a_lost_connection(
        self,
        adapter: NotifyAdapter,
        peer_adapter: NotifyAdapter,
        force_reconnect: ForceReconnect,
    ) -> None:
        self._requires_delivery()
        reconnects, rec = Recorder(), Recorder()
        adapter.on_reconnect(reconnects)
        chain = unique("chain")
        await adapter.listen_chain_completed(chain, rec)

        await force_reconnect()
        await reconnects.wait_for(1, self.delivery_timeout)
        await self._until_heard(rec, lambda: peer_adapter.notify_chain_completed(chain))

    async def test_on_reconnect_unsubscribe_is_idempotent_and_stops_the_callback(
        self,
        adapter: NotifyAdapter,
        peer_adapter: NotifyAdapter,
        force_reconnect: ForceReconnect,
    ) -> None:
        self._requires_delivery()
        gone, stays, rec = Recorder(), Recorder(), Recorder()
        unsubscribe = adapter.on_reconnect(gone)
        adapter.on_reconnect(stays)
        chain = unique("chain")
        await adapter.listen_chain_completed(chain, rec)
        await unsubscribe()
        await unsubscribe()

        await force_reconnect()
        await stays.wait_for(1, self.delivery_timeout)
        # Heard again: the subscription is restored, so every callback of this outage ran.
        await self._until_heard(rec, lambda: peer_adapter.notify_chain_completed(chain))
        await asyncio.sleep(self.quiet_period)
        assert gone.calls == [], "an unsubscribed on_reconnect callback is not called"
        await unsubscribe()

    async def _until_heard(self, rec: Recorder, publish: Callable[[], Awaitable[None]]) -> None:
        """Publish again and again until ``rec`` hears one: while the adapter is still
        reconnecting a message may be lost (notifications are hints)."""
        try:
            async with asyncio.timeout(self.delivery_timeout * 2):
                while not rec.calls:
                    with suppress(Exception):  # the publisher may notice the outage too
                        await publish()
                    await asyncio.sleep(0.1)
        except TimeoutError:
            pytest.fail("the listener heard nothing after the connection came back")
