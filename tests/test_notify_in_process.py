"""In-process wake budgets expire like the Redis ones: 60 s after the last provide."""

from __future__ import annotations

from queuert_notify import InProcessNotifyAdapter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_an_exhausted_budget_expires_60_seconds_after_the_last_provide() -> None:
    clock = FakeClock()
    async with InProcessNotifyAdapter(clock=clock) as adapter:
        await adapter.provide_wake_hint("t", 1)
        clock.now += 30
        await adapter.provide_wake_hint("t", 1)
        assert [await adapter.consume_wake_hint("t") for _ in range(3)] == [True, True, False]

        clock.now += 59.9
        assert await adapter.consume_wake_hint("t") is False, "the second provide restarted the TTL"
        clock.now += 0.1
        assert await adapter.consume_wake_hint("t") is True, "expired: wake rather than miss"


async def test_an_expired_budget_does_not_add_to_a_new_one() -> None:
    clock = FakeClock()
    async with InProcessNotifyAdapter(clock=clock) as adapter:
        await adapter.provide_wake_hint("t", 5)
        clock.now += 61
        await adapter.provide_wake_hint("t", 1)
        assert [await adapter.consume_wake_hint("t") for _ in range(2)] == [True, False]
