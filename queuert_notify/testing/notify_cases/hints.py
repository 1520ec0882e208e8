"""Notify-adapter conformance, wake hints: budgets add up, are kept per type, are taken
exactly once, and a poisoned one wakes rather than misses."""

from __future__ import annotations

import asyncio

import pytest

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing.notify_cases.support import NotifyCases, PoisonBudget, Recorder, unique


class HintsCases(NotifyCases):
    """Wake hints: cases every notify adapter must pass."""

    async def test_consume_without_any_budget_returns_true(self, adapter: NotifyAdapter) -> None:
        assert await adapter.consume_wake_hint(unique("type")) is True

    async def test_a_budget_of_two_wakes_exactly_two_concurrent_consumers(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_hints()
        type_name = unique("type")
        await peer_adapter.provide_wake_hint(type_name, 2)

        results = await asyncio.gather(*(adapter.consume_wake_hint(type_name) for _ in range(10)))

        assert results.count(True) == 2
        assert await adapter.consume_wake_hint(type_name) is False, "exhausted stays exhausted"

    async def test_budgets_from_separate_provides_add_up(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_hints()
        type_name = unique("type")
        await peer_adapter.provide_wake_hint(type_name, 3)
        await adapter.provide_wake_hint(type_name, 3)

        results = [await adapter.consume_wake_hint(type_name) for _ in range(8)]

        assert results == [True] * 6 + [False] * 2

    async def test_budgets_are_kept_per_type(self, adapter: NotifyAdapter) -> None:
        self._requires_hints()
        spent, untouched = unique("type"), unique("type")
        await adapter.provide_wake_hint(spent, 1)
        await adapter.provide_wake_hint(untouched, 1)
        assert await adapter.consume_wake_hint(spent) is True
        assert await adapter.consume_wake_hint(spent) is False
        assert await adapter.consume_wake_hint(untouched) is True

    async def test_a_zero_provide_does_not_hold_consumers_back(
        self, adapter: NotifyAdapter
    ) -> None:
        type_name = unique("type")
        await adapter.provide_wake_hint(type_name, 0)
        assert await adapter.consume_wake_hint(type_name) is True

    async def test_notify_jobs_scheduled_provides_each_budget_and_wakes_each_type(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        first, second = unique("type"), unique("type")
        rec = Recorder()
        await adapter.listen_job_scheduled([first, second], rec)

        await peer_adapter.notify_jobs_scheduled({first: 2, second: 1})

        if self.delivers:
            expected = (
                [(first,), (first,), (second,)] if self.wake_per_unit else [(first,), (second,)]
            )
            await rec.wait_for(len(expected), self.delivery_timeout)
            assert sorted(rec.calls) == sorted(expected)
        firsts = [await adapter.consume_wake_hint(first) for _ in range(3)]
        seconds = [await adapter.consume_wake_hint(second) for _ in range(2)]
        if self.supports_hints:
            assert (firsts, seconds) == ([True, True, False], [True, False])
        else:
            assert (firsts, seconds) == ([True] * 3, [True] * 2)

    @pytest.mark.parametrize("poison", ["text", "list"])
    async def test_a_poisoned_budget_is_replaced_and_its_announcement_still_goes_out(
        self,
        adapter: NotifyAdapter,
        peer_adapter: NotifyAdapter,
        poison_wake_budget: PoisonBudget,
        poison: str,
    ) -> None:
        self._requires_hints()
        type_name = unique("type")
        await poison_wake_budget(type_name, poison)
        rec = Recorder()
        await adapter.listen_job_scheduled([type_name], rec)

        await peer_adapter.notify_jobs_scheduled({type_name: 2})

        if self.delivers:
            await rec.wait_for(1, self.delivery_timeout)
        assert [await adapter.consume_wake_hint(type_name) for _ in range(3)] == [
            True,
            True,
            False,
        ]

    @pytest.mark.parametrize("poison", ["text", "list"])
    async def test_a_poisoned_budget_wakes_its_consumer_and_a_provide_repairs_it(
        self, adapter: NotifyAdapter, poison_wake_budget: PoisonBudget, poison: str
    ) -> None:
        self._requires_hints()
        type_name = unique("type")
        await poison_wake_budget(type_name, poison)

        assert await adapter.consume_wake_hint(type_name) is True, "wake rather than miss"
        await adapter.provide_wake_hint(type_name, 1)
        assert [await adapter.consume_wake_hint(type_name) for _ in range(2)] == [True, False]

    async def test_an_adapter_without_hints_always_grants_a_wake(
        self, adapter: NotifyAdapter
    ) -> None:
        if self.supports_hints:
            pytest.skip("this adapter keeps wake budgets")
        type_name = unique("type")
        await adapter.provide_wake_hint(type_name, 1)
        results = await asyncio.gather(*(adapter.consume_wake_hint(type_name) for _ in range(5)))
        assert results == [True] * 5
