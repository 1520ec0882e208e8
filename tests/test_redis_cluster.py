"""RedisNotifyAdapter on a real Redis Cluster: the notify contract, wake budgets, the
cluster wire layout, and one subscriber connection per master.

The cluster (3 masters, 3 replicas) is started once for this module by the
``redis_cluster`` fixture; nothing here kills or reshards it (see
``test_faults_redis_cluster.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from queuert_notify import ConfigurationError, RedisNotifyAdapter
from queuert_notify.notify.redis.adapter import MAX_PAYLOAD_BYTES
from queuert_notify.notify.redis.cluster import cluster_hint_key, cluster_name
from queuert_notify.testing import Recorder
from queuert_notify.testing.notify_conformance import PoisonBudget
from tests.support.queue_helpers import all_but_the_slowest
from tests.support.redis_cluster import ClusterConformance, LocalRedisCluster
from tests.support.redis_helpers import poison_redis_budget
from tests.support.services import free_port


def _types_on_every_master(cluster: LocalRedisCluster, prefix: str, per_master: int) -> list[str]:
    """Type names whose wake channels spread over every master, ``per_master`` each."""
    return cluster.names_on_every_master(partial(cluster_name, prefix, "sched"), per_master)


class TestRedisClusterNotifyAdapter(ClusterConformance):
    """The conformance suite: ``adapter`` from a URL, ``peer_adapter`` on a caller-owned
    RedisCluster client, so both ways of building the adapter are exercised."""

    @pytest.fixture
    async def poison_wake_budget(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[PoisonBudget]:
        client = RedisCluster.from_url(cluster.url)
        yield partial(poison_redis_budget, client, lambda t: cluster_hint_key(prefix, t))
        await client.aclose()


async def test_twenty_listeners_budget_of_three_exactly_three_wake(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    adapters = [cluster.adapter(prefix) for _ in range(20)]
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


@pytest.mark.parametrize("type_name", ["send-email", "a{b", "has}brace", "}", "{x}", "é"])
def test_a_types_budget_key_and_wake_channel_share_a_slot(type_name: str) -> None:
    key = cluster_hint_key("queuert", type_name)
    channel = cluster_name("queuert", "sched", type_name)
    assert key_slot(key.encode()) == key_slot(channel.encode())
    assert type_name in key and type_name in channel, "names stay readable and distinct"


def test_names_of_different_values_never_collide() -> None:
    values = ["a", "}a", "a}", "#a", "{a}", "a:b"]
    names = {cluster_name("q", "hint", value) for value in values}
    assert len(names) == len(values)


async def test_a_type_name_with_a_brace_gets_its_budget_and_its_wakeup(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    async with cluster.adapter(prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(["odd}name", "{plain}"], rec)
        await adapter.notify_jobs_scheduled({"odd}name": 1, "{plain}": 1})
        await rec.wait_for(2, within=5.0)
        assert sorted(rec.calls) == [("odd}name",), ("{plain}",)]
        assert [await adapter.consume_wake_hint("odd}name") for _ in range(2)] == [True, False]


async def test_notify_jobs_scheduled_runs_one_script_per_slot_on_the_slots_master(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """Budgets and wakeups of a type go to the one master owning its slot, nothing is
    broadcast: no PUBLISH anywhere, one EVALSHA per slot, SPUBLISH where the slot lives."""
    types = _types_on_every_master(cluster, prefix, per_master=2)
    counts = {name: 2 for name in types}
    async with cluster.adapter(prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(types, rec)
        before = {port: cluster.command_calls(port) for port in cluster.masters()}
        await adapter.notify_jobs_scheduled(counts)
        after = {port: cluster.command_calls(port) for port in cluster.masters()}
        await rec.wait_for(len(types), within=5.0)
        budgets = [await adapter.consume_wake_hint(t) for t in types for _ in range(3)]

    for port in cluster.masters():
        ran = {name: after[port].get(name, 0) - before[port].get(name, 0) for name in after[port]}
        mine = [t for t in types if cluster.owner_of(cluster_hint_key(prefix, t)) == port]
        slots = {key_slot(cluster_hint_key(prefix, t).encode()) for t in mine}
        assert ran.get("publish", 0) == 0, "classic PUBLISH would reach every node"
        assert ran.get("evalsha", 0) == len(slots)
        assert ran.get("spublish", 0) == len(mine)
        assert ran.get("incrby", 0) == len(mine)
    assert budgets == [True, True, False] * len(types)


async def test_one_subscriber_connection_per_master_that_owns_a_subscribed_slot(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    types = _types_on_every_master(cluster, prefix, per_master=5)
    async with cluster.adapter(prefix) as adapter:
        unsubscribes = [await adapter.listen_job_scheduled(types, Recorder())]
        for index in range(10):
            unsubscribes.append(await adapter.listen_chain_completed(f"chain-{index}", Recorder()))
        assert {port: cluster.shard_subscriber_connections(port) for port in cluster.masters()} == {
            port: 1 for port in cluster.masters()
        }

        for unsubscribe in unsubscribes:
            await unsubscribe()
        # A connection closes with its last channel; the server notices a moment later.
        deadline = time.monotonic() + 5.0
        while any(cluster.shard_subscriber_connections(port) for port in cluster.masters()):
            assert time.monotonic() < deadline, "subscriber connections left open"
            await asyncio.sleep(0.05)


async def test_a_master_with_no_subscribed_slot_gets_no_subscriber_connection(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    one_master = _types_on_every_master(cluster, prefix, per_master=1)[0]
    owner = cluster.owner_of(cluster_name(prefix, "sched", one_master))
    async with cluster.adapter(prefix) as adapter:
        await adapter.listen_job_scheduled([one_master], Recorder())
        connections = {
            port: cluster.shard_subscriber_connections(port) for port in cluster.masters()
        }
    assert connections == {port: int(port == owner) for port in cluster.masters()}


@pytest.mark.timing
async def test_no_delivery_waits_for_another_nodes_read_timeout(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """Every master's connection has its own reader: a round-robin reader would make a
    message wait for the other nodes' one-second read timeouts."""
    types = _types_on_every_master(cluster, prefix, per_master=2)
    async with (
        cluster.adapter(prefix) as listener,
        cluster.adapter(prefix) as publisher,
    ):
        rec = Recorder()
        await listener.listen_job_scheduled(types, rec)
        latencies = []
        for round_number in range(3):
            for type_name in types:
                started = time.monotonic()
                await publisher.notify_job_scheduled(type_name)
                await rec.wait_for(len(rec.calls) + 1, within=5.0)
                latencies.append(time.monotonic() - started)
            assert len(rec.calls) == len(types) * (round_number + 1)
    assert all_but_the_slowest(latencies) < 0.25, sorted(latencies)


async def test_malformed_payloads_from_strangers_are_ignored_and_counted(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    stranger = RedisCluster.from_url(cluster.url)
    try:
        async with cluster.adapter(prefix) as adapter:
            scheduled = Recorder()
            await adapter.listen_job_scheduled(["t"], scheduled)
            channel = cluster_name(prefix, "sched", "t")
            for garbage in [b"", b"\xff\xfe\x00", b"t" * (MAX_PAYLOAD_BYTES + 1)]:
                await stranger.spublish(channel, garbage)
            await stranger.spublish(channel, "someone-else")  # well-formed, for no one
            await stranger.spublish(channel, "t")
            await scheduled.wait_for(1, within=5.0)
            assert scheduled.calls == [("t",)]
            assert adapter.ignored_messages == 3
    finally:
        await stranger.aclose()


async def test_a_caller_owned_cluster_client_is_used_and_never_closed(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    client = RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_job_scheduled(["t"], rec)
            await adapter.notify_jobs_scheduled({"t": 1})
            await rec.wait_for(1, within=5.0)
            assert rec.calls == [("t",)], "payloads are decoded by the adapter, not the client"
            assert await client.get(cluster_hint_key(prefix, "t")) == "1"
        assert await client.ping() is True, "the caller's client still works after close()"
    finally:
        await client.aclose()


async def test_close_leaves_no_task_running(cluster: LocalRedisCluster, prefix: str) -> None:
    before = asyncio.all_tasks()
    adapter = cluster.adapter(prefix)
    try:
        await adapter.connect()
        adapter.on_reconnect(Recorder())
        await adapter.listen_job_scheduled(_types_on_every_master(cluster, prefix, 1), Recorder())
        await adapter.listen_chain_completed("c", Recorder())
        assert asyncio.all_tasks() != before, "readers run while connected"

        await adapter.close()

        assert asyncio.all_tasks() == before
    finally:
        await adapter.close()  # idempotent: a test failed before its close leaves nothing open


async def test_an_unreachable_cluster_fails_connect_naming_the_address_and_leaves_no_task() -> None:
    before = asyncio.all_tasks()
    port = free_port()
    adapter = RedisNotifyAdapter(
        f"redis://:hunter2@127.0.0.1:{port}", cluster=True, connect_timeout=2.0
    )
    with pytest.raises(ConfigurationError) as raised:
        await adapter.connect()
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message
    assert "hunter2" not in message
    await adapter.close()
    assert asyncio.all_tasks() == before


def test_cluster_mode_refuses_unix_sockets_and_single_server_clients() -> None:
    with pytest.raises(ConfigurationError, match=r"redis:// or rediss://"):
        RedisNotifyAdapter("unix:///tmp/redis.sock", cluster=True)
    with pytest.raises(ConfigurationError, match=r"RedisCluster"):
        RedisNotifyAdapter(client=Redis(), cluster=True)
