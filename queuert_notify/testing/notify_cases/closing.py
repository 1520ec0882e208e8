"""Notify-adapter conformance, closing: ``close()`` is idempotent, ends every listener,
and every later call says the adapter is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe
from queuert_notify.testing.notify_cases.support import NotifyCases, Recorder, unique


class ClosingCases(NotifyCases):
    """Closing: cases every notify adapter must pass."""

    async def test_close_is_idempotent(self, adapter: NotifyAdapter) -> None:
        await adapter.close()
        await adapter.close()

    async def test_every_call_after_close_raises_closed_error(self, adapter: NotifyAdapter) -> None:
        await adapter.close()
        name = unique("name")
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: adapter.notify_job_scheduled(name),
            lambda: adapter.listen_job_scheduled([name], Recorder()),
            lambda: adapter.provide_wake_hint(name, 1),
            lambda: adapter.consume_wake_hint(name),
            lambda: adapter.notify_jobs_scheduled({name: 1}),
            lambda: adapter.notify_chain_completed(name),
            lambda: adapter.listen_chain_completed(name, Recorder()),
            lambda: adapter.notify_job_ownership_lost(name),
            lambda: adapter.listen_job_ownership_lost(name, Recorder()),
        ]
        for call in calls:
            with pytest.raises(NotifyAdapterClosedError):
                await call()
        with pytest.raises(NotifyAdapterClosedError):
            adapter.on_reconnect(Recorder())

    async def test_unsubscribe_functions_stay_safe_after_close(
        self, adapter: NotifyAdapter
    ) -> None:
        name = unique("name")
        unsubscribes: list[Unsubscribe] = [
            await adapter.listen_job_scheduled([name], Recorder()),
            await adapter.listen_chain_completed(name, Recorder()),
            await adapter.listen_job_ownership_lost(name, Recorder()),
            adapter.on_reconnect(Recorder()),
        ]
        await adapter.close()
        for unsubscribe in unsubscribes:
            await unsubscribe()
            await unsubscribe()

    async def test_async_with_returns_the_adapter_and_closes_it(
        self, adapter: NotifyAdapter
    ) -> None:
        async with adapter as entered:
            assert entered is adapter
            await adapter.notify_chain_completed(unique("chain"))
        with pytest.raises(NotifyAdapterClosedError):
            await adapter.notify_chain_completed(unique("chain"))

    async def test_a_closed_adapter_calls_no_listener(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        if peer_adapter is adapter:
            pytest.skip("needs a separate peer_adapter to publish after close")
        rec = Recorder()
        chain = unique("chain")
        await adapter.listen_chain_completed(chain, rec)
        await adapter.close()
        await peer_adapter.notify_chain_completed(chain)
        await asyncio.sleep(self.quiet_period)
        assert rec.calls == []
