"""Redis wake budgets: a burst of N jobs wakes N workers, not every listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.redis.shared import hint_key
from queuert_notify.testing import Recorder
from tests.support.redis_helpers import delete_prefix
from tests.support.services import OwnServer


@pytest.fixture
async def redis(redis_url: str, prefix: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()
    await delete_prefix(redis_url, prefix)


async def test_twenty_listeners_budget_of_three_exactly_three_wake(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    adapters = [RedisNotifyAdapter(redis_url, prefix=prefix) for _ in range(20)]
    results: list[bool] = []
    done = Recorder()
    try:
        for adapter in adapters:
            await adapter.connect()

            async def on_scheduled(type_name: str, adapter: RedisNotifyAdapter = adapter) -> None:
                results.append(await adapter.consume_wake_hint(type_name))
                done()

            await adapter.listen_job_scheduled(["send-email"], on_scheduled)

        await adapters[0].notify_jobs_scheduled({"send-email": 3})
        await done.wait_for(20, within=5.0)
    finally:
        for adapter in adapters:
            await adapter.close()

    assert sorted(results) == [False] * 17 + [True] * 3


async def test_a_budget_expires_60_seconds_after_the_last_provide(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    key = hint_key(prefix, "t")
    async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
        await adapter.provide_wake_hint("t", 2)
        await redis.expire(key, 5)
        await adapter.provide_wake_hint("t", 1)
        assert 59_000 < await redis.pttl(key) <= 60_000, "a provide restarts the 60 s TTL"

        assert await adapter.consume_wake_hint("t") is True
        assert 59_000 < await redis.pttl(key) <= 60_000, "consuming keeps the TTL"
        assert await redis.get(key) == b"2"

        await redis.delete(key)
        assert await adapter.consume_wake_hint("t") is True, "expired: wake rather than miss"


async def test_a_budget_key_holding_garbage_wakes_instead_of_failing(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    await redis.set(hint_key(prefix, "t"), "not-a-number", ex=60)
    async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
        assert await adapter.consume_wake_hint("t") is True


async def test_hints_keep_working_after_script_flush(private_redis: OwnServer, prefix: str) -> None:
    async with RedisNotifyAdapter(private_redis.url, prefix=prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(["t"], rec)
        admin = Redis.from_url(private_redis.url)
        try:
            await admin.script_flush()
            await adapter.provide_wake_hint("t", 1)
            await admin.script_flush()
            assert await adapter.consume_wake_hint("t") is True
            assert await adapter.consume_wake_hint("t") is False
            await admin.script_flush()
            await adapter.notify_jobs_scheduled({"t": 1})
            await rec.wait_for(1, within=5.0)
            assert await adapter.consume_wake_hint("t") is True
        finally:
            await admin.aclose()


async def test_notify_jobs_scheduled_is_one_round_trip(
    private_redis: OwnServer, prefix: str
) -> None:
    """Every command the server ran came from one EVALSHA: one request, one reply."""
    counts = {"a": 1, "b": 2, "c": 3}
    admin = Redis.from_url(private_redis.url)
    try:
        async with RedisNotifyAdapter(private_redis.url, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_job_scheduled(list(counts), rec)
            before = await _command_calls(admin)
            await adapter.notify_jobs_scheduled(counts)
            after = await _command_calls(admin)
            await rec.wait_for(3, within=5.0)
            budgets = [await adapter.consume_wake_hint(t) for t in counts for _ in range(4)]
    finally:
        await admin.aclose()

    ran = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    ran.pop("info")
    assert {name: n for name, n in ran.items() if n} == {
        "evalsha": 1,  # the only command sent
        "type": 3,  # ... and what it ran inside Redis: a look at each budget's type,
        "incrby": 3,
        "expire": 3,
        "publish": 3,
    }
    assert budgets == [True, False, False, False] + [True] * 2 + [False] * 2 + [True] * 3 + [False]


async def _command_calls(admin: Redis) -> dict[str, int]:
    stats = await admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_concurrent_providers_add_up(redis_url: str, prefix: str, redis: Redis) -> None:
    async with (
        RedisNotifyAdapter(redis_url, prefix=prefix) as one,
        RedisNotifyAdapter(redis_url, prefix=prefix) as two,
    ):
        await asyncio.gather(
            *(one.provide_wake_hint("t", 3) for _ in range(5)),
            *(two.notify_jobs_scheduled({"t": 3}) for _ in range(5)),
        )
        assert await redis.get(hint_key(prefix, "t")) == b"30"


async def test_an_exhausted_budget_without_expiry_gets_its_expiry_back(
    redis_url: str, prefix: str, redis: Redis
) -> None:
    """A budget someone set without a TTL would otherwise answer "exhausted" forever and
    silence its type's wakeups for good."""
    key = hint_key(prefix, "t")
    await redis.set(key, "0")
    async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
        assert await adapter.consume_wake_hint("t") is False
    assert 0 < await redis.ttl(key) <= 60
