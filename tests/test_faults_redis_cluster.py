"""Faults a Redis Cluster adapter survives: a master killed (its replica takes over), a
slot resharded to another master, and a close while a master is down; a worker that
keeps running jobs through a master's death, and SyncClient's publisher that follows it.

This module has a cluster of its own (the ``redis_cluster`` fixture is module
scoped); every test leaves it settled with all six nodes running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.crc import key_slot
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, Job, JobContext, RedisNotifyAdapter, Worker
from queuert_notify.notify.redis import sharded_subscriber
from queuert_notify.notify.redis.cluster import cluster_hint_key, cluster_name
from queuert_notify.testing import Recorder
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.notifications import NotificationBuffer
from tests.support.leaks import connections_to, unclosed_reports
from tests.support.queue_helpers import wait_until
from tests.support.redis_cluster import LocalRedisCluster


@pytest.fixture
async def adapters(
    cluster: LocalRedisCluster, prefix: str
) -> AsyncIterator[tuple[RedisNotifyAdapter, RedisNotifyAdapter]]:
    """A listening adapter and a publishing one, on the same prefix."""
    async with (
        cluster.adapter(prefix) as listener,
        cluster.adapter(prefix) as publisher,
    ):
        yield listener, publisher


def _type_on(cluster: LocalRedisCluster, prefix: str, port: int, skip: int = 0) -> str:
    """A type name whose wake channel (and budget key) lives on master ``port``."""
    return cluster.name_on(port, lambda name: cluster_name(prefix, "sched", name), skip)


async def test_after_a_master_is_killed_subscriptions_follow_its_replica(
    cluster: LocalRedisCluster,
    prefix: str,
    adapters: tuple[RedisNotifyAdapter, RedisNotifyAdapter],
) -> None:
    listener, publisher = adapters
    doomed, survivor = cluster.masters()[:2]
    on_doomed, fresh_on_doomed = (_type_on(cluster, prefix, doomed, skip) for skip in (0, 1))
    on_survivor = _type_on(cluster, prefix, survivor)
    reconnects, scheduled, completed = Recorder(), Recorder(), Recorder()
    listener.on_reconnect(reconnects)
    await listener.listen_job_scheduled([on_doomed, fresh_on_doomed, on_survivor], scheduled)
    chain = next(
        f"chain-{i}"
        for i in range(1000)
        if cluster.owner_of(cluster_name(prefix, "chainc", f"chain-{i}")) == doomed
    )
    await listener.listen_chain_completed(chain, completed)

    replica = await asyncio.to_thread(cluster.kill_master_and_wait_for_failover, doomed)
    # Once when the connection to the dead master broke, once when every channel is
    # subscribed on the replica that took over: poll now.
    await reconnects.wait_for(2, within=15.0)
    assert cluster.shard_subscriber_connections(replica) == 1

    await publisher.notify_jobs_scheduled({on_doomed: 1, fresh_on_doomed: 2, on_survivor: 1})
    await publisher.notify_chain_completed(chain)
    await scheduled.wait_for(3, within=5.0)
    await completed.wait_for(1, within=5.0)
    assert sorted(scheduled.calls) == sorted([(on_doomed,), (fresh_on_doomed,), (on_survivor,)])
    hints = [await listener.consume_wake_hint(fresh_on_doomed) for _ in range(3)]
    assert hints == [True, True, False], "budgets work on the promoted replica"
    assert len(reconnects.calls) == 2, "one loss, one restore"


async def test_a_worker_with_a_60s_poll_runs_every_job_through_a_masters_death(
    cluster: LocalRedisCluster, prefix: str, tmp_path: Path
) -> None:
    doomed = cluster.masters()[0]
    type_name = _type_on(cluster, prefix, doomed)  # its wakeups travel through the doomed master

    async def handler(job: Job, ctx: JobContext) -> int:
        return int(job.input["n"])

    def notify() -> RedisNotifyAdapter:
        return cluster.adapter(prefix)

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await state.migrate()
        async with (
            Client(state=state, notify=notify()) as producer,
            Client(state=state, notify=notify()) as worker_client,
            Worker(worker_client, {type_name: handler}, poll_interval=60),
        ):
            first = await producer.start_chain(type_name, {"n": 0})
            assert (await producer.await_chain(first.id, timeout=10)).output == 0

            # Jobs committed while the master is dead: their wakeups are lost (the client
            # logs it); the worker polls when its subscription is restored.
            replica = cluster.replica_of(doomed)
            cluster.kill(doomed)
            chains = [await producer.start_chain(type_name, {"n": n}) for n in range(1, 4)]
            await asyncio.to_thread(cluster.wait_for_failover, doomed, replica)
            # And one after: woken through the promoted replica.
            chains.append(await producer.start_chain(type_name, {"n": 4}))

            for n, chain in enumerate(chains, start=1):
                done = await producer.await_chain(chain.id, timeout=20, poll_interval=0.5)
                assert (done.status, done.output) == ("completed", n)
    finally:
        await engine.dispose()


async def test_a_sync_clients_publisher_follows_a_killed_master_to_its_replica(
    cluster: LocalRedisCluster,
    prefix: str,
    adapters: tuple[RedisNotifyAdapter, RedisNotifyAdapter],
) -> None:
    listener, _ = adapters
    doomed = cluster.masters()[0]
    type_name = _type_on(cluster, prefix, doomed)
    notes = NotificationBuffer()
    notes.job_scheduled(type_name)
    heard, reconnects = Recorder(), Recorder()
    listener.on_reconnect(reconnects)
    await listener.listen_job_scheduled([type_name], heard)
    publisher = cluster.adapter(prefix).blocking_publisher()
    try:
        await asyncio.to_thread(publisher.publish, notes)  # its slot map names ``doomed``
        await heard.wait_for(1, within=5.0)
        replica = await asyncio.to_thread(cluster.kill_master_and_wait_for_failover, doomed)
        assert cluster.owner_of(cluster_name(prefix, "sched", type_name)) == replica
        await reconnects.wait_for(2, within=15.0)  # the listener is back, on the replica

        await asyncio.to_thread(publisher.publish, notes)
        await heard.wait_for(2, within=5.0)
    finally:
        await asyncio.to_thread(publisher.close)


async def test_when_a_slot_is_resharded_the_subscription_and_the_budget_follow_it(
    cluster: LocalRedisCluster,
    prefix: str,
    adapters: tuple[RedisNotifyAdapter, RedisNotifyAdapter],
) -> None:
    listener, publisher = adapters
    source, target = cluster.masters()[:2]
    moving = _type_on(cluster, prefix, source)
    staying = _type_on(cluster, prefix, source, skip=1)  # keeps the source connection open
    reconnects, scheduled = Recorder(), Recorder()
    listener.on_reconnect(reconnects)
    await listener.listen_job_scheduled([moving, staying], scheduled)
    await publisher.provide_wake_hint(moving, 3)
    assert await listener.consume_wake_hint(moving) is True

    slot = key_slot(cluster_hint_key(prefix, moving).encode())
    await asyncio.to_thread(cluster.move_slot, slot, target)
    # The source dropped the shard channel (an unrequested SUNSUBSCRIBE): followed. The
    # bound is for a stalled machine (10 s ran out once beside a --stress run's load).
    await reconnects.wait_for(2, within=60.0)
    assert cluster.owner_of(cluster_name(prefix, "sched", moving)) == target

    await publisher.notify_job_scheduled(moving)
    await publisher.notify_job_scheduled(staying)
    await scheduled.wait_for(2, within=5.0)
    assert sorted(scheduled.calls) == sorted([(moving,), (staying,)])
    hints = [await listener.consume_wake_hint(moving) for _ in range(3)]
    assert hints == [True, True, False], "the budget moved with its slot"
    assert cluster.shard_subscriber_connections(target) == 1


async def test_close_while_a_master_is_down_is_prompt_and_leaves_no_task(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    before = asyncio.all_tasks()
    doomed = cluster.masters()[0]
    replica = cluster.replica_of(doomed)
    # Waits a close must not make: the close timeout, and the reconciler's wait for a
    # subscription's confirmation (the connect timeout). Both long, so that the bound
    # below leaves a stalled machine room and still tells a prompt close from a wait.
    adapter = cluster.adapter(prefix, close_timeout=30.0, connect_timeout=30.0)
    try:
        await adapter.connect()
        reconnects = Recorder()
        adapter.on_reconnect(reconnects)
        await adapter.listen_job_scheduled([_type_on(cluster, prefix, doomed)], Recorder())

        await asyncio.to_thread(cluster.kill, doomed)
        await reconnects.wait_for(1, within=10.0)
        await asyncio.sleep(0.3)  # the reconciler is retrying against the dead master now

        loop = asyncio.get_running_loop()
        started = loop.time()
        await adapter.close()

        assert loop.time() - started < 10.0  # not a 30 s wait; room for a stall
        assert asyncio.all_tasks() == before
        await asyncio.to_thread(cluster.wait_for_failover, doomed, replica)
    finally:
        await adapter.close()  # idempotent: a test failed before its close leaves nothing open


async def test_a_listen_on_a_slot_moved_behind_the_adapters_back_still_subscribes_where_it_lives(
    cluster: LocalRedisCluster,
    prefix: str,
    adapters: tuple[RedisNotifyAdapter, RedisNotifyAdapter],
) -> None:
    """The adapter's slot map is stale (it had nothing subscribed in the moved slot, so
    no node told it): the old owner refuses the SSUBSCRIBE with MOVED, the adapter
    refreshes its map and subscribes on the new owner, without disturbing others."""
    listener, publisher = adapters
    source, target = cluster.masters()[:2]
    keep, late = _type_on(cluster, prefix, source), _type_on(cluster, prefix, source, skip=1)
    reconnects, scheduled = Recorder(), Recorder()
    listener.on_reconnect(reconnects)
    await listener.listen_job_scheduled([keep], scheduled)

    slot = key_slot(cluster_name(prefix, "sched", late).encode())
    await asyncio.to_thread(cluster.move_slot, slot, target)
    await listener.listen_job_scheduled([late], scheduled)

    await publisher.notify_job_scheduled(late)
    await publisher.notify_job_scheduled(keep)
    await scheduled.wait_for(2, within=5.0)
    assert sorted(scheduled.calls) == sorted([(late,), (keep,)])
    assert reconnects.calls == [], "nothing was lost: no reason to make workers poll"


async def test_a_master_that_hangs_without_closing_its_socket_is_left_by_the_slot_map_check(
    cluster: LocalRedisCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused master (like a partitioned one) breaks no connection and announces no
    move; the periodic slot-map check finds its replica took over."""
    monkeypatch.setattr(sharded_subscriber, "_TOPOLOGY_CHECK", 0.5)
    doomed = cluster.masters()[0]
    replica = cluster.replica_of(doomed)
    type_name = _type_on(cluster, prefix, doomed)
    async with cluster.adapter(prefix) as listener:
        reconnects, scheduled = Recorder(), Recorder()
        listener.on_reconnect(reconnects)
        await listener.listen_job_scheduled([type_name], scheduled)

        await asyncio.to_thread(cluster.pause, doomed)
        try:
            await asyncio.to_thread(cluster.wait_for_failover, doomed, replica)
            await reconnects.wait_for(2, within=20.0)
            async with cluster.adapter(prefix) as publisher:
                await publisher.notify_job_scheduled(type_name)
                await scheduled.wait_for(1, within=5.0)
        finally:
            await asyncio.to_thread(cluster.resume, doomed)
        assert scheduled.calls == [(type_name,)]


async def test_a_close_held_up_by_a_hanging_master_still_closes_the_cluster_client(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """A subscription stuck on a master that hangs (its kernel accepts the connection,
    nothing answers) holds the close up past ``close_timeout``; the cluster client the
    adapter opened is closed all the same: no node is left connected for the garbage
    collector, which redis-py reports as "Unclosed ClusterNode object"."""
    doomed = cluster.masters()[0]
    with unclosed_reports() as reports:
        adapter = cluster.adapter(prefix, close_timeout=1.0, connect_timeout=60.0)
        await adapter.connect()
        before = connections_to(doomed)
        await asyncio.to_thread(cluster.pause, doomed)
        try:
            stuck = asyncio.create_task(
                adapter.listen_job_scheduled([_type_on(cluster, prefix, doomed)], Recorder())
            )
            # The subscriber's connection is open: its handshake waits for the master.
            await wait_until(lambda: connections_to(doomed) > before, timeout=30.0)
            await adapter.close()
            stuck.cancel()
            await asyncio.gather(stuck, return_exceptions=True)
        finally:
            await asyncio.to_thread(cluster.resume, doomed)
        del adapter, stuck
    assert reports == []
