"""Faults the Redis subscriber survives: a server restart, and strangers on our channels."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.redis.adapter import MAX_PAYLOAD_BYTES
from queuert_notify.notify.redis.shared import RETRY_ATTEMPTS, channel_name
from queuert_notify.testing import Recorder
from tests.support.backoff_checks import assert_backoff_grows
from tests.support.redis_helpers import delete_prefix, wait_for_subscribers
from tests.support.services import OwnServer
from tests.support.tcp_proxy import TcpProxy


async def test_after_a_server_restart_the_subscriber_resubscribes_and_fires_on_reconnect(
    private_redis: OwnServer, prefix: str
) -> None:
    async with RedisNotifyAdapter(private_redis.url, prefix=prefix) as adapter:
        reconnects = Recorder()
        adapter.on_reconnect(reconnects)
        scheduled, completed = Recorder(), Recorder()
        await adapter.listen_job_scheduled(["t"], scheduled)
        await adapter.listen_chain_completed("c", completed)

        await asyncio.to_thread(private_redis.kill)
        await reconnects.wait_for(1, within=10.0)  # the loss itself: poll now
        lost_signals = len(reconnects.calls)
        await asyncio.sleep(0.5)  # down for a while: the reader backs off, no hot loop
        assert len(reconnects.calls) == lost_signals, "one signal per outage, not per retry"

        await asyncio.to_thread(private_redis.start)
        await wait_for_subscribers(private_redis.url, channel_name(prefix, "sched"), 1, 15.0)
        await wait_for_subscribers(private_redis.url, channel_name(prefix, "chainc"), 1, 5.0)
        await reconnects.wait_for(lost_signals + 1, within=5.0)  # restored: poll again

        # Scripts are gone from the restarted server: reloaded transparently.
        await adapter.notify_jobs_scheduled({"t": 1})
        await adapter.notify_chain_completed("c")
        await scheduled.wait_for(1, within=5.0)
        await completed.wait_for(1, within=5.0)
        assert await adapter.consume_wake_hint("t") is True
        assert await adapter.consume_wake_hint("t") is False


async def test_while_redis_resets_every_connection_the_subscriber_waits_longer_each_time(
    redis_url: str, prefix: str
) -> None:
    proxy = await TcpProxy.in_front_of(redis_url)
    try:
        async with RedisNotifyAdapter(proxy.url(redis_url), prefix=prefix) as adapter:
            reconnects, rec = Recorder(), Recorder()
            adapter.on_reconnect(reconnects)
            await adapter.listen_chain_completed("c", rec)

            proxy.mode = "reset"
            await asyncio.sleep(5.5)
            # Each round of the reader's loop is one connect that redis-py itself retries
            # RETRY_ATTEMPTS times; between rounds the shared Backoff (50 ms doubling to
            # 2 s) waits ever longer.
            assert_backoff_grows(proxy.reset_times, per_round=RETRY_ATTEMPTS + 1)
            assert len(reconnects.calls) == 1, "one signal per outage, not per attempt"

            proxy.mode = "forward"
            await reconnects.wait_for(2, within=10.0)
            await adapter.notify_chain_completed("c")
            await rec.wait_for(1, within=5.0)
    finally:
        await proxy.close()
        await delete_prefix(redis_url, prefix)


async def test_malformed_payloads_from_strangers_are_ignored_and_counted(
    redis_url: str, prefix: str
) -> None:
    stranger = Redis.from_url(redis_url)
    try:
        async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
            scheduled, completed = Recorder(), Recorder()
            await adapter.listen_job_scheduled(["t"], scheduled)
            await adapter.listen_chain_completed("c", completed)
            sched, chainc = channel_name(prefix, "sched"), channel_name(prefix, "chainc")

            not_utf8 = "c\udcff".encode("utf-8", "surrogateescape")
            for garbage in [b"", b"\xff\xfe\x00", b"t" * (MAX_PAYLOAD_BYTES + 1)]:
                await stranger.publish(sched, garbage)
            await stranger.publish(chainc, not_utf8)
            await stranger.publish(sched, b'{"type": "t"}')  # well-formed, for no one
            await stranger.publish(sched, "t")
            await stranger.publish(chainc, "c")

            await scheduled.wait_for(1, within=5.0)
            await completed.wait_for(1, within=5.0)
            assert scheduled.calls == [("t",)]
            assert completed.calls == [()]
            assert adapter.ignored_messages == 4
    finally:
        await stranger.aclose()
        await delete_prefix(redis_url, prefix)


async def test_close_while_the_server_is_down_is_prompt_and_leaves_no_task(
    private_redis: OwnServer, prefix: str
) -> None:
    before = asyncio.all_tasks()
    adapter = RedisNotifyAdapter(private_redis.url, prefix=prefix, close_timeout=5.0)
    await adapter.connect()
    await adapter.listen_job_scheduled(["t"], Recorder())
    reconnects = Recorder()
    adapter.on_reconnect(reconnects)
    await asyncio.to_thread(private_redis.kill)
    await reconnects.wait_for(1, within=10.0)

    loop = asyncio.get_running_loop()
    started = loop.time()
    await adapter.close()

    assert loop.time() - started < 4.0  # not the 5 s close_timeout; room for a stall
    assert asyncio.all_tasks() == before


async def test_a_listen_while_the_subscriber_reconnects_leaves_the_reconnect_to_the_reader(
    redis_url: str, prefix: str
) -> None:
    """A listen made during an outage (a worker starting a run, say, bounded to a
    second) fails at once instead of connecting the subscriber itself beside the
    reader: two connects on one redis-py connection read each other's replies, and
    the restore went unnoticed (twice in loaded CI runs: no second on_reconnect
    within 60 s). The reader alone reconnects, and says so."""
    proxy = await TcpProxy.in_front_of(redis_url)
    try:
        async with RedisNotifyAdapter(proxy.url(redis_url), prefix=prefix) as adapter:
            reconnects, scheduled = Recorder(), Recorder()
            adapter.on_reconnect(reconnects)
            await adapter.listen_job_scheduled(["t"], scheduled)

            await proxy.refuse()
            await reconnects.wait_for(1, within=10.0)
            await proxy.restore()
            proxy.mode = "blackhole"  # back, but the handshake hangs
            for job_id in ("j1", "j2", "j3"):
                with pytest.raises(RedisConnectionError, match="reconnecting"):
                    async with asyncio.timeout(10.0):
                        await adapter.listen_job_ownership_lost(job_id, Recorder())
            proxy.mode = "forward"

            await reconnects.wait_for(2, within=30.0)
            await wait_for_subscribers(redis_url, channel_name(prefix, "sched"), 1, 15.0)
            await adapter.notify_jobs_scheduled({"t": 1})
            await scheduled.wait_for(1, within=10.0)
    finally:
        await proxy.close()
        await delete_prefix(redis_url, prefix)
