"""Notify-adapter conformance, listening: every notification reaches exactly the listeners
of its name, promptly, whatever the callbacks do."""

from __future__ import annotations

import asyncio

import pytest

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing.notify_cases.support import NotifyCases, Recorder, unique


class ListeningCases(NotifyCases):
    """Delivery: cases every notify adapter must pass."""

    async def test_job_scheduled_reaches_listener_of_that_type(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        wanted, other = unique("type"), unique("type")
        rec, probe = Recorder(), Recorder()
        await adapter.listen_job_scheduled([wanted], rec)
        await adapter.listen_job_scheduled([other], probe)

        await peer_adapter.notify_job_scheduled(other)
        await peer_adapter.notify_job_scheduled(wanted)
        await rec.wait_for(1, self.delivery_timeout)
        await probe.wait_for(1, self.delivery_timeout)

        assert rec.calls == [(wanted,)], "a listener hears only the types it listens to"
        assert probe.calls == [(other,)]

    async def test_one_listener_for_several_types_hears_each_with_its_name(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        first, second = unique("type"), unique("type")
        rec = Recorder()
        await adapter.listen_job_scheduled([first, second], rec)

        await peer_adapter.notify_job_scheduled(first)
        await peer_adapter.notify_job_scheduled(second)
        await rec.wait_for(2, self.delivery_timeout)

        assert sorted(rec.calls) == sorted([(first,), (second,)])

    async def test_chain_completed_reaches_only_that_chains_listener(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chain, other = unique("chain"), unique("chain")
        rec, probe = Recorder(), Recorder()
        await adapter.listen_chain_completed(chain, rec)
        await adapter.listen_chain_completed(other, probe)

        await peer_adapter.notify_chain_completed(other)
        await peer_adapter.notify_chain_completed(chain)
        await rec.wait_for(1, self.delivery_timeout)
        await probe.wait_for(1, self.delivery_timeout)

        assert rec.calls == [()], "the callback takes no arguments and runs once"
        assert probe.calls == [()]

    async def test_ownership_lost_reaches_only_that_jobs_listener(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        job, other = unique("job"), unique("job")
        rec, probe = Recorder(), Recorder()
        await adapter.listen_job_ownership_lost(job, rec)
        await adapter.listen_job_ownership_lost(other, probe)

        await peer_adapter.notify_job_ownership_lost(other)
        await peer_adapter.notify_job_ownership_lost(job)
        await rec.wait_for(1, self.delivery_timeout)
        await probe.wait_for(1, self.delivery_timeout)

        assert rec.calls == [()]
        assert probe.calls == [()]

    async def test_channels_are_separate(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        name = unique("same-name")
        scheduled, completed, lost = Recorder(), Recorder(), Recorder()
        await adapter.listen_job_scheduled([name], scheduled)
        await adapter.listen_chain_completed(name, completed)
        await adapter.listen_job_ownership_lost(name, lost)

        await peer_adapter.notify_chain_completed(name)
        await completed.wait_for(1, self.delivery_timeout)
        await peer_adapter.notify_job_ownership_lost(name)
        await lost.wait_for(1, self.delivery_timeout)
        await peer_adapter.notify_job_scheduled(name)
        await scheduled.wait_for(1, self.delivery_timeout)
        await self._sentinel_round(adapter, peer_adapter)

        assert (len(scheduled.calls), len(completed.calls), len(lost.calls)) == (1, 1, 1)

    async def test_every_listener_of_a_name_is_called_once(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        type_name, chain = unique("type"), unique("chain")
        type_recs = [Recorder() for _ in range(3)]
        chain_recs = [Recorder() for _ in range(3)]
        for rec in type_recs:
            await adapter.listen_job_scheduled([type_name], rec)
        for rec in chain_recs:
            await adapter.listen_chain_completed(chain, rec)

        await peer_adapter.notify_job_scheduled(type_name)
        await peer_adapter.notify_chain_completed(chain)
        for rec in [*type_recs, *chain_recs]:
            await rec.wait_for(1, self.delivery_timeout)
        await self._sentinel_round(adapter, peer_adapter)

        assert [len(rec.calls) for rec in type_recs] == [1, 1, 1]
        assert [len(rec.calls) for rec in chain_recs] == [1, 1, 1]

    async def test_async_callbacks_are_awaited(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        type_name = unique("type")
        rec = Recorder()

        async def callback(name: str) -> None:
            await asyncio.sleep(0)
            rec(name)

        await adapter.listen_job_scheduled([type_name], callback)
        await peer_adapter.notify_job_scheduled(type_name)
        await rec.wait_for(1, self.delivery_timeout)
        assert rec.calls == [(type_name,)]

    async def test_failing_callback_affects_neither_others_nor_the_subscription(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chain = unique("chain")
        failures = Recorder()
        rec = Recorder()

        def failing() -> None:
            failures()
            raise RuntimeError("listener bug (expected in this test)")

        async def failing_async() -> None:
            failures()
            raise RuntimeError("async listener bug (expected in this test)")

        await adapter.listen_chain_completed(chain, failing)
        await adapter.listen_chain_completed(chain, failing_async)
        await adapter.listen_chain_completed(chain, rec)

        await peer_adapter.notify_chain_completed(chain)
        await peer_adapter.notify_chain_completed(chain)
        await rec.wait_for(2, self.delivery_timeout)
        await failures.wait_for(4, self.delivery_timeout)

    async def test_publishing_with_no_listener_is_harmless(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        # The listener of other names comes first, so each channel is subscribed before
        # anything is published on it: a channel first subscribed after it carried a
        # message is the nats-server 2.9.10 loss of docs/reliability.md, not this case.
        listened = unique("listened")
        rec = Recorder()
        await adapter.listen_job_scheduled([listened], rec)
        await adapter.listen_chain_completed(listened, rec)
        await adapter.listen_job_ownership_lost(listened, rec)

        await peer_adapter.notify_job_scheduled(unique("type"))
        await peer_adapter.notify_chain_completed(unique("chain"))
        await peer_adapter.notify_job_ownership_lost(unique("job"))
        await peer_adapter.notify_jobs_scheduled({unique("type"): 2})
        if not self.delivers:
            return
        await peer_adapter.notify_job_scheduled(listened)
        await peer_adapter.notify_chain_completed(listened)
        await peer_adapter.notify_job_ownership_lost(listened)
        await rec.wait_for(3, self.delivery_timeout)
        assert sorted(rec.calls) == [(), (), (listened,)], "nobody else heard anything"

    async def test_notifications_arrive_while_the_publisher_is_still_publishing(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chains = [unique("chain") for _ in range(10)]
        published = 0
        seen_while_publishing: list[int] = []
        rec = Recorder()

        def on_completed() -> None:
            seen_while_publishing.append(published)
            rec()

        for chain in chains:
            await adapter.listen_chain_completed(chain, on_completed)
        for chain in chains:
            await peer_adapter.notify_chain_completed(chain)
            published += 1
            await asyncio.sleep(0.03)
        await rec.wait_for(len(chains), self.delivery_timeout)

        assert min(seen_while_publishing) < len(chains), (
            "the first notification must be delivered before the publisher finishes, "
            f"not batched to the end (seen after {seen_while_publishing} publishes)"
        )

    async def test_connect_again_changes_nothing(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        rec = Recorder()
        chain = unique("chain")
        await adapter.listen_chain_completed(chain, rec)
        await adapter.connect()
        await adapter.connect()
        await peer_adapter.notify_chain_completed(chain)
        if not self.delivers:
            await asyncio.sleep(self.quiet_period)
            assert rec.calls == [], "this adapter delivers nothing"
            return
        await rec.wait_for(1, self.delivery_timeout)
        await self._sentinel_round(adapter, peer_adapter)
        assert rec.calls == [()], "a second connect() must not double a subscription"

    async def test_an_adapter_that_delivers_nothing_never_calls_listeners(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        if self.delivers:
            pytest.skip("this adapter delivers notifications")
        rec = Recorder()
        name = unique("name")
        await adapter.listen_job_scheduled([name], rec)
        await adapter.listen_chain_completed(name, rec)
        await adapter.listen_job_ownership_lost(name, rec)
        await peer_adapter.notify_job_scheduled(name)
        await peer_adapter.notify_jobs_scheduled({name: 1})
        await peer_adapter.notify_chain_completed(name)
        await peer_adapter.notify_job_ownership_lost(name)
        await asyncio.sleep(self.quiet_period)
        assert rec.calls == []
