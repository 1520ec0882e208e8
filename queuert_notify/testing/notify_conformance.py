"""The notify-adapter contract as runnable tests: subclass, provide ``adapter``, run pytest.

Example (needs pytest and pytest-asyncio)::

    import pytest
    from queuert_notify import InProcessNotifyAdapter
    from queuert_notify.testing import NotifyAdapterConformance

    class TestMyAdapter(NotifyAdapterConformance):
        @pytest.fixture
        async def adapter(self):
            async with InProcessNotifyAdapter() as adapter:
                yield adapter

Fixtures a subclass provides:

- ``adapter`` (required): a connected adapter; the suite may close it, so its
  teardown must tolerate a second ``close()`` (the contract says it does).
- ``peer_adapter`` (optional): a second connected adapter on the same
  transport (same server and prefix). Every delivery test listens on
  ``adapter`` and publishes from ``peer_adapter``, and budgets provided on
  one are consumed on the other, so cross-process behaviour is exercised.
  Defaults to ``adapter`` itself.

Class attributes describe what the adapter promises:

- ``delivers``: False for adapters that never call listeners (noop).
- ``supports_hints``: False for adapters whose ``provide_wake_hint`` is a
  no-op and whose ``consume_wake_hint`` always returns True.
- ``wake_per_unit``: True for adapters whose wakes are the budget itself (one
  unit, one call of one listening adapter: ``RedisNotifyAdapter(wake="lists")``),
  so ``notify_jobs_scheduled({t: 2})`` calls a listener of ``t`` twice.
- ``delivery_timeout``: how long a delivery may take before the test fails.
- ``quiet_period``: how long to wait before concluding "nothing arrives"
  where no later message can prove it.

Negative checks ("this listener is not called") are proven with a sentinel
published afterwards on the same channel, so they cost no sleeps and need
only per-channel ordering from one publisher.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ClassVar

import pytest
import pytest_asyncio

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe


def _unique(kind: str) -> str:
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


PoisonBudget = Callable[[str, str], Awaitable[None]]
"""``poison(type_name, kind)``: see :meth:`NotifyAdapterConformance.poison_wake_budget`."""


class NotifyAdapterConformance:
    """Base class of the notify-adapter conformance tests (not collected by itself)."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    delivers: ClassVar[bool] = True
    supports_hints: ClassVar[bool] = True
    wake_per_unit: ClassVar[bool] = False
    delivery_timeout: ClassVar[float] = 5.0
    quiet_period: ClassVar[float] = 0.3

    @pytest_asyncio.fixture
    async def adapter(self) -> AsyncIterator[NotifyAdapter]:
        """Override: yield a connected adapter."""
        pytest.fail("subclass NotifyAdapterConformance and provide an `adapter` fixture")
        yield  # pragma: no cover

    @pytest_asyncio.fixture
    async def peer_adapter(self, adapter: NotifyAdapter) -> AsyncIterator[NotifyAdapter]:
        """Override: yield a second connected adapter on the same transport."""
        yield adapter

    @pytest_asyncio.fixture
    async def poison_wake_budget(self) -> AsyncIterator[PoisonBudget]:
        """Override (adapters whose budgets are stored where others can write them):
        yield ``poison(type_name, kind)`` that stores, as the budget of ``type_name``,
        what a stranger or a bug might: ``kind`` "text" (a string that is no integer)
        or "list" (a value of another type)."""
        pytest.skip("this adapter does not say how its stored budgets could be poisoned")
        yield  # pragma: no cover

    # -- delivery ------------------------------------------------------------

    async def test_job_scheduled_reaches_listener_of_that_type(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        wanted, other = _unique("type"), _unique("type")
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
        first, second = _unique("type"), _unique("type")
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
        chain, other = _unique("chain"), _unique("chain")
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
        job, other = _unique("job"), _unique("job")
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
        name = _unique("same-name")
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
        type_name, chain = _unique("type"), _unique("chain")
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
        type_name = _unique("type")
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
        chain = _unique("chain")
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

    async def test_unsubscribed_listener_hears_nothing_more(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        type_name, chain, job = _unique("type"), _unique("chain"), _unique("job")
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

    async def test_unsubscribe_is_idempotent_and_spares_other_listeners(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chain = _unique("chain")
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
        type_name = _unique("type")
        for _ in range(3):
            unsubscribe = await adapter.listen_job_scheduled([type_name], Recorder())
            await unsubscribe()
        rec = Recorder()
        await adapter.listen_job_scheduled([type_name], rec)

        await peer_adapter.notify_job_scheduled(type_name)
        await rec.wait_for(1, self.delivery_timeout)
        await self._sentinel_round(adapter, peer_adapter)
        assert rec.calls == [(type_name,)]

    async def test_publishing_with_no_listener_is_harmless(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        await peer_adapter.notify_job_scheduled(_unique("type"))
        await peer_adapter.notify_chain_completed(_unique("chain"))
        await peer_adapter.notify_job_ownership_lost(_unique("job"))
        await peer_adapter.notify_jobs_scheduled({_unique("type"): 2})
        if self.delivers:
            await self._sentinel_round(adapter, peer_adapter)

    async def test_notifications_arrive_while_the_publisher_is_still_publishing(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_delivery()
        chains = [_unique("chain") for _ in range(10)]
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
        chain = _unique("chain")
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
        name = _unique("name")
        await adapter.listen_job_scheduled([name], rec)
        await adapter.listen_chain_completed(name, rec)
        await adapter.listen_job_ownership_lost(name, rec)
        await peer_adapter.notify_job_scheduled(name)
        await peer_adapter.notify_jobs_scheduled({name: 1})
        await peer_adapter.notify_chain_completed(name)
        await peer_adapter.notify_job_ownership_lost(name)
        await asyncio.sleep(self.quiet_period)
        assert rec.calls == []

    # -- wake hints ----------------------------------------------------------

    async def test_consume_without_any_budget_returns_true(self, adapter: NotifyAdapter) -> None:
        assert await adapter.consume_wake_hint(_unique("type")) is True

    async def test_a_budget_of_two_wakes_exactly_two_concurrent_consumers(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_hints()
        type_name = _unique("type")
        await peer_adapter.provide_wake_hint(type_name, 2)

        results = await asyncio.gather(*(adapter.consume_wake_hint(type_name) for _ in range(10)))

        assert results.count(True) == 2
        assert await adapter.consume_wake_hint(type_name) is False, "exhausted stays exhausted"

    async def test_budgets_from_separate_provides_add_up(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        self._requires_hints()
        type_name = _unique("type")
        await peer_adapter.provide_wake_hint(type_name, 3)
        await adapter.provide_wake_hint(type_name, 3)

        results = [await adapter.consume_wake_hint(type_name) for _ in range(8)]

        assert results == [True] * 6 + [False] * 2

    async def test_budgets_are_kept_per_type(self, adapter: NotifyAdapter) -> None:
        self._requires_hints()
        spent, untouched = _unique("type"), _unique("type")
        await adapter.provide_wake_hint(spent, 1)
        await adapter.provide_wake_hint(untouched, 1)
        assert await adapter.consume_wake_hint(spent) is True
        assert await adapter.consume_wake_hint(spent) is False
        assert await adapter.consume_wake_hint(untouched) is True

    async def test_a_zero_provide_does_not_hold_consumers_back(
        self, adapter: NotifyAdapter
    ) -> None:
        type_name = _unique("type")
        await adapter.provide_wake_hint(type_name, 0)
        assert await adapter.consume_wake_hint(type_name) is True

    async def test_notify_jobs_scheduled_provides_each_budget_and_wakes_each_type(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        first, second = _unique("type"), _unique("type")
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
        type_name = _unique("type")
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
        type_name = _unique("type")
        await poison_wake_budget(type_name, poison)

        assert await adapter.consume_wake_hint(type_name) is True, "wake rather than miss"
        await adapter.provide_wake_hint(type_name, 1)
        assert [await adapter.consume_wake_hint(type_name) for _ in range(2)] == [True, False]

    async def test_an_adapter_without_hints_always_grants_a_wake(
        self, adapter: NotifyAdapter
    ) -> None:
        if self.supports_hints:
            pytest.skip("this adapter keeps wake budgets")
        type_name = _unique("type")
        await adapter.provide_wake_hint(type_name, 1)
        results = await asyncio.gather(*(adapter.consume_wake_hint(type_name) for _ in range(5)))
        assert results == [True] * 5

    # -- lifecycle -------------------------------------------------------------

    async def test_close_is_idempotent(self, adapter: NotifyAdapter) -> None:
        await adapter.close()
        await adapter.close()

    async def test_every_call_after_close_raises_closed_error(self, adapter: NotifyAdapter) -> None:
        await adapter.close()
        name = _unique("name")
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
        name = _unique("name")
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

    async def test_on_reconnect_returns_an_idempotent_unsubscribe(
        self, adapter: NotifyAdapter
    ) -> None:
        unsubscribe = adapter.on_reconnect(Recorder())
        await unsubscribe()
        await unsubscribe()

    async def test_async_with_returns_the_adapter_and_closes_it(
        self, adapter: NotifyAdapter
    ) -> None:
        async with adapter as entered:
            assert entered is adapter
            await adapter.notify_chain_completed(_unique("chain"))
        with pytest.raises(NotifyAdapterClosedError):
            await adapter.notify_chain_completed(_unique("chain"))

    async def test_a_closed_adapter_calls_no_listener(
        self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter
    ) -> None:
        if peer_adapter is adapter:
            pytest.skip("needs a separate peer_adapter to publish after close")
        rec = Recorder()
        chain = _unique("chain")
        await adapter.listen_chain_completed(chain, rec)
        await adapter.close()
        await peer_adapter.notify_chain_completed(chain)
        await asyncio.sleep(self.quiet_period)
        assert rec.calls == []

    # -- helpers -------------------------------------------------------------

    def _requires_delivery(self) -> None:
        if not self.delivers:
            pytest.skip("this adapter delivers no notifications")

    def _requires_hints(self) -> None:
        if not self.supports_hints:
            pytest.skip("this adapter keeps no wake budgets")

    async def _sentinel_round(self, adapter: NotifyAdapter, peer_adapter: NotifyAdapter) -> None:
        """Publish a fresh message on every channel and wait for all of them, so
        anything published earlier by ``peer_adapter`` has been delivered."""
        name = _unique("sentinel")
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
