"""Faults ``RedisNotifyAdapter(wake="lists", cluster=True)`` survives: a master killed
(its replica takes over), a master paused (partitioned) and a slot resharded while
a consumer blocks on it, and a close while a master is down. A worker process
SIGKILLed holding a moved token: ``test_faults_redis_lists.py`` (``cluster``).

This module has a cluster of its own (the ``redis_cluster`` fixture is module
scoped); every test leaves it settled with all six nodes running.
"""

from __future__ import annotations

import asyncio

from redis.crc import key_slot

from queuert_notify.notify.redis.lists_lines import SOCKET_TIMEOUT
from queuert_notify.testing import Recorder
from tests.support.queue_helpers import wait_until
from tests.support.redis_cluster import LocalRedisCluster
from tests.test_redis_cluster_lists import lists_adapter, tokens_of


def _type_on(cluster: LocalRedisCluster, prefix: str, port: int, skip: int = 0) -> str:
    """A type name whose keys live on master ``port``."""
    return cluster.name_on(port, lambda name: tokens_of(prefix, name), skip)


def _replica_holds(cluster: LocalRedisCluster, replica: int, key: str, length: int) -> bool:
    with cluster.node(replica).client() as client:
        client.execute_command("READONLY")
        return int(client.llen(key)) == length


async def test_after_a_master_is_killed_consumers_block_on_its_replica_and_no_token_is_lost(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """A consumer blocked on the dead master notices at once and blocks on the replica
    that took over; a busy one's tokens wait on their list through the failover."""
    doomed, survivor = cluster.masters()[:2]
    waiting, fresh = (_type_on(cluster, prefix, doomed, skip) for skip in (0, 1))
    on_survivor = _type_on(cluster, prefix, survivor)
    replica = cluster.replica_of(doomed)
    async with (
        lists_adapter(cluster, prefix) as busy,
        lists_adapter(cluster, prefix) as idle,
        lists_adapter(cluster, prefix) as producer,
    ):
        busy_heard, idle_heard, idle_reconnects = Recorder(), Recorder(), Recorder()
        idle.on_reconnect(idle_reconnects)
        await busy.listen_job_scheduled([waiting, on_survivor], busy_heard)
        await busy.acknowledge_wakes(busy_heard, 0)  # no free slot: the tokens wait
        await idle.listen_job_scheduled([fresh], idle_heard)
        await wait_until(lambda: cluster.blocked_movers(doomed) == 1, timeout=5)
        await producer.notify_jobs_scheduled({waiting: 2})
        # Replicated before the kill (asynchronous replication may lose a last write;
        # the catch-up poll on reconnect covers that, not tested here).
        key = tokens_of(prefix, waiting)
        await wait_until(lambda: _replica_holds(cluster, replica, key, 2), timeout=5)

        assert await asyncio.to_thread(cluster.kill_master_and_wait_for_failover, doomed) == replica
        # The blocked consumer: lost (poll now), then restored on the replica (poll again).
        await idle_reconnects.wait_for(2, within=15)
        await wait_until(lambda: cluster.blocked_movers(replica) == 1, timeout=5)

        busy_reconnects = Recorder()
        busy.on_reconnect(busy_reconnects)
        await busy.acknowledge_wakes(busy_heard, 5)  # free again: the waiting tokens come
        await busy_heard.wait_for(2, within=10)
        await producer.notify_jobs_scheduled({waiting: 1, on_survivor: 1, fresh: 1})
        await busy_heard.wait_for(4, within=5)
        await idle_heard.wait_for(1, within=5)
        assert sorted(busy_heard.calls) == sorted([(waiting,)] * 3 + [(on_survivor,)])
        assert idle_heard.calls == [(fresh,)]
        assert len(idle_reconnects.calls) == 2, "one loss, one restore"
        assert len(busy_reconnects.calls) == 2, "its stale connection failed once, then blocked"


async def test_when_a_slot_is_resharded_the_blocking_connection_follows_it(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    source, target = cluster.masters()[:2]
    moving = _type_on(cluster, prefix, source)
    async with (
        lists_adapter(cluster, prefix) as consumer,
        lists_adapter(cluster, prefix) as producer,
    ):
        heard = Recorder()
        await consumer.listen_job_scheduled([moving], heard)
        await wait_until(lambda: cluster.blocked_movers(source) == 1, timeout=5)

        slot = key_slot(tokens_of(prefix, moving).encode())
        await asyncio.to_thread(cluster.move_slot, slot, target)
        await wait_until(lambda: cluster.blocked_movers(target) == 1, timeout=15)

        await producer.notify_jobs_scheduled({moving: 2})
        await heard.wait_for(2, within=5)
        assert heard.calls == [(moving,), (moving,)]
        assert cluster.blocked_movers(source) == 0


async def test_a_master_that_hangs_is_left_once_the_blocking_socket_times_out(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """A paused master (like a partitioned one) breaks no connection and sends no
    MOVED: the blocked move's socket times out, and the consumer follows the slot map
    to the replica that took over."""
    doomed = cluster.masters()[0]
    replica = cluster.replica_of(doomed)
    type_name = _type_on(cluster, prefix, doomed)
    async with lists_adapter(cluster, prefix) as consumer:
        reconnects, heard = Recorder(), Recorder()
        consumer.on_reconnect(reconnects)
        await consumer.listen_job_scheduled([type_name], heard)
        await wait_until(lambda: cluster.blocked_movers(doomed) == 1, timeout=5)

        await asyncio.to_thread(cluster.pause, doomed)
        try:
            await asyncio.to_thread(cluster.wait_for_failover, doomed, replica)
            await reconnects.wait_for(2, within=SOCKET_TIMEOUT + 10)
            async with lists_adapter(cluster, prefix) as producer:
                await producer.notify_job_scheduled(type_name)
                await heard.wait_for(1, within=5)
        finally:
            await asyncio.to_thread(cluster.resume, doomed)
        assert heard.calls == [(type_name,)]


async def test_close_while_a_master_is_down_is_bounded_and_leaves_no_task(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    before = asyncio.all_tasks()
    doomed = cluster.masters()[0]
    replica = cluster.replica_of(doomed)
    # Long enough that the orderly close (a loop's stop grace, the give-back, an unblock:
    # about 3.5 s at worst) ends within it on a stalled machine too; the bound below
    # still holds the close to it.
    consumer = cluster.adapter(prefix, wake="lists", close_timeout=8.0)
    try:
        await consumer.connect()
        reconnects = Recorder()
        consumer.on_reconnect(reconnects)
        await consumer.listen_job_scheduled([_type_on(cluster, prefix, doomed)], Recorder())

        await asyncio.to_thread(cluster.kill, doomed)
        await reconnects.wait_for(1, within=10)

        loop = asyncio.get_running_loop()
        started = loop.time()
        await consumer.close()

        assert loop.time() - started < 8.0 + 2.5  # close_timeout, and room for a stalled machine
        assert asyncio.all_tasks() == before
        await asyncio.to_thread(cluster.wait_for_failover, doomed, replica)
    finally:
        await consumer.close()  # idempotent: a test failed before its close leaves nothing open
