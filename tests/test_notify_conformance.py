"""Every shipped notify adapter passes the conformance suite users run on their own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import pytest
from redis.asyncio import Redis

from queuert_notify import InProcessNotifyAdapter, NoopNotifyAdapter, RedisNotifyAdapter
from queuert_notify.notify.redis.shared import hint_key, token_list_key
from queuert_notify.testing import NotifyAdapterConformance
from queuert_notify.testing.notify_conformance import ForceReconnect, PoisonBudget
from tests.support.redis_helpers import (
    delete_prefix,
    kill_subscribers,
    named,
    poison_redis_budget,
)


class TestInProcessNotifyAdapter(NotifyAdapterConformance):
    @pytest.fixture
    async def adapter(self) -> AsyncIterator[InProcessNotifyAdapter]:
        async with InProcessNotifyAdapter() as adapter:
            yield adapter


class TestNoopNotifyAdapter(NotifyAdapterConformance):
    delivers = False
    supports_hints = False

    @pytest.fixture
    async def adapter(self) -> AsyncIterator[NoopNotifyAdapter]:
        async with NoopNotifyAdapter() as adapter:
            yield adapter


class TestRedisNotifyAdapter(NotifyAdapterConformance):
    @pytest.fixture
    async def adapter(self, redis_url: str, prefix: str) -> AsyncIterator[RedisNotifyAdapter]:
        # Named connections: force_reconnect finds this adapter's subscriber by its name.
        async with RedisNotifyAdapter(named(redis_url, prefix), prefix=prefix) as adapter:
            yield adapter
        await delete_prefix(redis_url, prefix)

    @pytest.fixture
    async def force_reconnect(self, redis_url: str, prefix: str) -> AsyncIterator[ForceReconnect]:
        yield partial(kill_subscribers, redis_url, prefix)

    @pytest.fixture
    async def poison_wake_budget(self, redis_url: str, prefix: str) -> AsyncIterator[PoisonBudget]:
        client = Redis.from_url(redis_url)
        yield partial(poison_redis_budget, client, lambda t: hint_key(prefix, t))
        await client.aclose()

    @pytest.fixture
    async def peer_adapter(self, redis_url: str, prefix: str) -> AsyncIterator[RedisNotifyAdapter]:
        async with RedisNotifyAdapter(redis_url, prefix=prefix) as peer:
            yield peer


class TestRedisListsNotifyAdapter(NotifyAdapterConformance):
    """``wake="lists"``: wakes are tokens, so one unit is one call of one listener."""

    wake_per_unit = True

    @pytest.fixture
    async def adapter(self, redis_url: str, prefix: str) -> AsyncIterator[RedisNotifyAdapter]:
        # Named connections: force_reconnect finds this adapter's subscriber by its name.
        url = named(redis_url, prefix)
        async with RedisNotifyAdapter(url, prefix=prefix, wake="lists") as adapter:
            yield adapter
        await delete_prefix(redis_url, prefix)

    @pytest.fixture
    async def force_reconnect(self, redis_url: str, prefix: str) -> AsyncIterator[ForceReconnect]:
        # The reconnect cases listen on Pub/Sub channels (chain completed), which lists
        # mode keeps; a Redis restart in test_faults_redis_lists drops the blocking one.
        yield partial(kill_subscribers, redis_url, prefix)

    @pytest.fixture
    async def poison_wake_budget(self, redis_url: str, prefix: str) -> AsyncIterator[PoisonBudget]:
        client = Redis.from_url(redis_url)

        async def poison(type_name: str, kind: str) -> None:
            # A list is what a token list is: "list" stores another type (a hash) instead.
            key = token_list_key(prefix, type_name)
            await client.delete(key)
            if kind == "text":
                await client.set(key, "not-a-number")
            else:
                await client.hset(key, "token", "1")

        yield poison
        await client.aclose()

    @pytest.fixture
    async def peer_adapter(self, redis_url: str, prefix: str) -> AsyncIterator[RedisNotifyAdapter]:
        async with RedisNotifyAdapter(redis_url, prefix=prefix, wake="lists") as peer:
            yield peer
