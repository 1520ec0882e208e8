"""Notify-adapter conformance, unsubscribing: an unsubscribed listener hears nothing more,
the others keep hearing, and a channel can be listened to again."""

from __future__ import annotations

import pytest

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing.notify_cases.support import NotifyCases, Recorder, unique


class UnsubscribingCases(NotifyCases):
    """Unsubscribing: cases every notify adapter must pass."""

    async def test_unsubscribed_listener_hears_nothing_more(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        type_name, chain, job = unique("type"), unique("chain"), unique("job")
        gone = Recorder()
        stays = Recorder()
        unsubscribes = [
            await adapter.listen_job_scheduled([type_name], gone),
            await adapter.listen_chain_completed(chain, gone),
            await adapter.listen_job_ownership_lost(job, gone),
        ]
        await adapter.listen_job_scheduled([type_name], stays)
        await adapter.listen_chain_completed(chain, stays)
        await adapter.listen_job_ownership_lost(job, stays)
        for unsubscribe in unsubscribes:
            await unsubscribe()

        await peer_adapter.notify_job_scheduled(type_name)
        await peer_adapter.notify_chain_completed(chain)
        await peer_adapter.notify_job_ownership_lost(job)
        await stays.wait_for(3, self.delivery_timeout)

        assert gone.calls == [], "same channel, same payload: the unsubscribed one is skipped"

    async def test_a_listener_of_every_job_hears_each_loss_with_its_id_until_it_leaves(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        every = Recorder()
        unsubscribe = await adapter.listen_every_job_ownership_lost(every)
        if unsubscribe is None:
            pytest.skip("this adapter listens for ownership loss per job only")
        first, second, after = unique("job"), unique("job"), unique("job")
        await peer_adapter.notify_job_ownership_lost(first)
        await peer_adapter.notify_job_ownership_lost(second)
        await self._sentinel_round(adapter, peer_adapter)
        await unsubscribe()
        await unsubscribe()
        await peer_adapter.notify_job_ownership_lost(after)
        await self._sentinel_round(adapter, peer_adapter)

        # Other tests' jobs may share the channel: only this test's names are asserted.
        ours = [call for call in every.calls if call in {(first,), (second,), (after,)}]
        assert ours == [(first,), (second,)], "each loss once, with its job id, in order"

    async def test_unsubscribe_is_idempotent_and_spares_other_listeners(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chain = unique("chain")
        rec = Recorder()
        unsubscribe = await adapter.listen_chain_completed(chain, Recorder())
        await adapter.listen_chain_completed(chain, rec)

        await unsubscribe()
        await unsubscribe()
        await peer_adapter.notify_chain_completed(chain)
        await rec.wait_for(1, self.delivery_timeout)

    async def test_resubscribing_after_the_last_listener_left_hears_again(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        type_name = unique("type")
        for _ in range(3):
            unsubscribe = await adapter.listen_job_scheduled([type_name], Recorder())
            await unsubscribe()
        rec = Recorder()
        await adapter.listen_job_scheduled([type_name], rec)

        await peer_adapter.notify_job_scheduled(type_name)
        await rec.wait_for(1, self.delivery_timeout)
        await self._sentinel_round(adapter, peer_adapter)
        assert rec.calls == [(type_name,)]
