"""One transport subscription per channel, however many callbacks come and go."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from queuert_notify import NotifyAdapterClosedError, RedisNotifyAdapter, Unsubscribe
from queuert_notify.notify.redis.shared import channel_name
from queuert_notify.notify.shared_listener import ANY_PAYLOAD, SharedListener
from queuert_notify.testing import Recorder
from tests.support.redis_helpers import delete_prefix, named


class CountingTransport:
    """An in-memory transport that records what the listener asked of it."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_subscribe = False

    async def subscribe(self, channel: str) -> None:
        await asyncio.sleep(0)  # a real transport yields here; let racers interleave
        if self.fail_subscribe:
            raise ConnectionError("transport down")
        self.calls.append(("subscribe", channel))
        self.live[channel] = self.live.get(channel, 0) + 1

    async def unsubscribe(self, channel: str) -> None:
        await asyncio.sleep(0)
        self.calls.append(("unsubscribe", channel))
        self.live[channel] -= 1


@pytest.fixture
def transport() -> CountingTransport:
    return CountingTransport()


@pytest.fixture
async def listener(transport: CountingTransport) -> AsyncIterator[SharedListener]:
    shared = SharedListener(transport.subscribe, transport.unsubscribe)
    yield shared
    await shared.dispose()


async def test_subscribes_on_first_callback_and_unsubscribes_after_the_last(
    listener: SharedListener, transport: CountingTransport
) -> None:
    first = await listener.add("ch", ["a"], Recorder())
    second = await listener.add("ch", ["b"], Recorder())
    assert transport.calls == [("subscribe", "ch")]

    await first()
    assert transport.live == {"ch": 1}, "one callback left: the subscription stays"
    await second()
    assert transport.calls[-1] == ("unsubscribe", "ch")
    assert transport.live == {"ch": 0}
    assert listener.channels == []


async def test_concurrent_adds_open_one_subscription(
    listener: SharedListener, transport: CountingTransport
) -> None:
    await asyncio.gather(*(listener.add("ch", [str(i)], Recorder()) for i in range(50)))
    assert transport.calls == [("subscribe", "ch")]


async def test_a_failed_subscribe_leaves_nothing_registered(
    listener: SharedListener, transport: CountingTransport
) -> None:
    transport.fail_subscribe = True
    with pytest.raises(ConnectionError):
        await listener.add("ch", ["a"], Recorder())
    assert listener.channels == []

    transport.fail_subscribe = False
    rec = Recorder()
    await listener.add("ch", ["a"], rec)
    assert listener.dispatch("ch", "a", "arg") == 1
    assert rec.calls == [("arg",)]


async def test_dispatch_routes_by_payload_and_to_every_payload_listeners(
    listener: SharedListener,
) -> None:
    only_a, only_b, every = Recorder(), Recorder(), Recorder()
    await listener.add("ch", ["a"], only_a)
    await listener.add("ch", ["b"], only_b)
    await listener.add("ch", [ANY_PAYLOAD], every)

    assert listener.dispatch("ch", "a") == 2
    assert listener.dispatch("ch", "zzz") == 1
    assert listener.dispatch("other", "a") == 0
    assert (len(only_a.calls), len(only_b.calls), len(every.calls)) == (1, 0, 2)


async def test_a_callback_registered_under_repeated_keys_runs_once(
    listener: SharedListener,
) -> None:
    rec = Recorder()
    unsubscribe = await listener.add("ch", ["a", "a"], rec)
    listener.dispatch("ch", "a")
    assert len(rec.calls) == 1
    await unsubscribe()
    await unsubscribe()
    assert listener.channels == []


async def test_callback_failures_are_isolated(listener: SharedListener) -> None:
    rec = Recorder()

    def broken() -> None:
        raise RuntimeError("listener bug (expected in this test)")

    async def broken_async() -> None:
        raise RuntimeError("async listener bug (expected in this test)")

    await listener.add("ch", ["a"], broken)
    await listener.add("ch", ["a"], broken_async)
    await listener.add("ch", ["a"], rec)
    assert listener.dispatch("ch", "a") == 3
    await asyncio.sleep(0)
    assert listener.dispatch("ch", "a") == 3
    assert len(rec.calls) == 2


async def test_dispose_unsubscribes_everything_and_cancels_running_callbacks(
    transport: CountingTransport,
) -> None:
    listener = SharedListener(transport.subscribe, transport.unsubscribe)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    unsubscribe = await listener.add("ch", ["a"], slow)
    await listener.add("other", ["b"], Recorder())
    listener.dispatch("ch", "a")
    await started.wait()

    await listener.dispose()
    await listener.dispose()

    assert transport.live == {"ch": 0, "other": 0}
    assert cancelled.is_set(), "a callback still running at dispose is cancelled"
    await unsubscribe()  # safe after dispose
    with pytest.raises(NotifyAdapterClosedError):
        await listener.add("ch", ["a"], Recorder())


async def test_a_kept_channel_stays_subscribed_while_callbacks_come_and_go(
    listener: SharedListener, transport: CountingTransport
) -> None:
    await listener.keep_subscribed("ch")
    await listener.keep_subscribed("ch")
    assert transport.calls == [("subscribe", "ch")], "subscribed at once, once"
    assert listener.channels == ["ch"], "re-subscribed after a reconnect like any other"

    for key in ("a", "b", "c"):
        unsubscribe = await listener.add("ch", [key], Recorder())
        await unsubscribe()
    assert transport.calls == [("subscribe", "ch")], "no round trip per callback"
    assert transport.live == {"ch": 1}
    assert listener.dispatch("ch", "a") == 0, "nobody left to call"

    rec = Recorder()
    await listener.add("ch", ["a"], rec)
    assert listener.dispatch("ch", "a", "arg") == 1
    assert rec.calls == [("arg",)]


async def test_keeping_a_channel_that_has_callbacks_keeps_it_after_the_last_leaves(
    listener: SharedListener, transport: CountingTransport
) -> None:
    unsubscribe = await listener.add("ch", ["a"], Recorder())
    await listener.keep_subscribed("ch")
    await unsubscribe()
    assert transport.calls == [("subscribe", "ch")]
    assert transport.live == {"ch": 1}


async def test_concurrent_keeps_and_adds_open_one_subscription(
    listener: SharedListener, transport: CountingTransport
) -> None:
    await asyncio.gather(
        *(listener.keep_subscribed("ch") for _ in range(20)),
        *(listener.add("ch", [str(i)], Recorder()) for i in range(20)),
    )
    assert transport.calls == [("subscribe", "ch")]


async def test_a_failed_keep_leaves_nothing_subscribed_and_can_be_tried_again(
    listener: SharedListener, transport: CountingTransport
) -> None:
    transport.fail_subscribe = True
    with pytest.raises(ConnectionError):
        await listener.keep_subscribed("ch")
    assert listener.channels == []

    transport.fail_subscribe = False
    await listener.keep_subscribed("ch")
    assert transport.live == {"ch": 1}


async def test_dispose_unsubscribes_a_kept_channel_and_later_keeps_raise(
    transport: CountingTransport,
) -> None:
    listener = SharedListener(transport.subscribe, transport.unsubscribe)
    await listener.keep_subscribed("ch")
    await listener.dispose()
    assert transport.live == {"ch": 0}
    with pytest.raises(NotifyAdapterClosedError):
        await listener.keep_subscribed("ch")


async def test_a_worker_pattern_on_redis_subscribes_the_ownership_channel_once(
    redis_url: str, prefix: str
) -> None:
    """Each run listens for its job's ownership loss and leaves: the channel stays
    subscribed (the server's own count) with no run left, until close()."""
    owls = channel_name(prefix, "owls")
    observer = Redis.from_url(redis_url)
    try:
        async with RedisNotifyAdapter(named(redis_url, prefix), prefix=prefix) as adapter:
            for job in range(5):
                unsubscribe = await adapter.listen_job_ownership_lost(f"j{job}", Recorder())
                await unsubscribe()
            assert dict(await observer.pubsub_numsub(owls)) == {owls.encode(): 1}
            clients = await observer.client_list(_type="pubsub")
            [subscriber] = [c for c in clients if c["name"] == prefix]
            assert subscriber["sub"] == "1", "the adapter's subscriber holds that channel only"

            rec = Recorder()
            await adapter.listen_job_ownership_lost("j9", rec)
            await adapter.notify_job_ownership_lost("j9")
            await rec.wait_for(1, within=5.0)
        assert dict(await observer.pubsub_numsub(owls)) == {owls.encode(): 0}
    finally:
        await observer.aclose()


async def test_1000_concurrent_subscribes_and_unsubscribes_leave_one_redis_subscription_or_none(
    redis_url: str, prefix: str
) -> None:
    """PUBSUB NUMSUB is the server's own count: never 2 (a double), never 1 with no listener
    (but for the ownership-lost channel, kept once listened until close)."""
    rng = random.Random(7)
    channels = [channel_name(prefix, kind) for kind in ("sched", "chainc", "owls")]
    observer = Redis.from_url(redis_url)
    try:
        async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
            kept: list[Unsubscribe] = []

            async def churn(i: int) -> None:
                name = f"n{rng.randrange(20)}"
                kind = i % 3
                if kind == 0:
                    unsubscribe = await adapter.listen_job_scheduled([name], Recorder())
                elif kind == 1:
                    unsubscribe = await adapter.listen_chain_completed(name, Recorder())
                else:
                    unsubscribe = await adapter.listen_job_ownership_lost(name, Recorder())
                await asyncio.sleep(rng.random() * 0.01)
                # Keep a few on the chain channel only; every other registration leaves.
                if kind == 1 and rng.random() < 0.02:
                    kept.append(unsubscribe)
                else:
                    await unsubscribe()

            await asyncio.gather(*(churn(i) for i in range(1000)))

            counts = dict(await observer.pubsub_numsub(*channels))
            expected = {c.encode(): 0 for c in channels}
            expected[channels[2].encode()] = 1
            if kept:
                expected[channels[1].encode()] = 1
            assert counts == expected

            await asyncio.gather(*(unsubscribe() for unsubscribe in kept))
            counts = dict(await observer.pubsub_numsub(*channels))
            assert counts == {c.encode(): int(c == channels[2]) for c in channels}
        counts = dict(await observer.pubsub_numsub(*channels))
        assert counts == {c.encode(): 0 for c in channels}, "close() drops the kept channel"
    finally:
        await observer.aclose()
        await delete_prefix(redis_url, prefix)
