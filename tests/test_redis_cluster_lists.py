"""``RedisNotifyAdapter(wake="lists", cluster=True)`` on a real Redis Cluster: the notify
contract, a type's keys in one slot, tokens on every master waking the consumer that
listens, one script per slot per push, one blocking connection per slot listened to.

Faults (failover, resharding, a killed worker) are in
``test_faults_redis_cluster_lists.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.redis.shared import (
    consumers_key,
    hash_tag,
    issued_key,
    processing_key,
    token_list_key,
)
from queuert_notify.testing import Recorder
from queuert_notify.testing.notify_conformance import PoisonBudget
from tests.support.queue_helpers import wait_until
from tests.support.redis_cluster import ClusterConformance, LocalRedisCluster


def lists_adapter(cluster: LocalRedisCluster, prefix: str) -> RedisNotifyAdapter:
    return cluster.adapter(prefix, wake="lists")


def tokens_of(prefix: str, type_name: str) -> str:
    """The token list of ``type_name`` on a cluster."""
    return token_list_key(prefix, hash_tag(type_name))


def types_on_every_master(cluster: LocalRedisCluster, prefix: str, per_master: int) -> list[str]:
    """Type names whose token lists spread over every master, ``per_master`` each."""
    return cluster.names_on_every_master(partial(tokens_of, prefix), per_master)


class TestRedisClusterListsNotifyAdapter(ClusterConformance):
    """The conformance suite on cluster + lists: ``adapter`` from a URL, ``peer_adapter``
    on a caller-owned RedisCluster client."""

    wake = "lists"
    wake_per_unit = True
    # The reconnect cases listen on shard channels (chain completed), which lists mode
    # keeps, so killing the shard subscribers forces them; the failover tests drop the
    # blocking connections.

    @pytest.fixture
    async def poison_wake_budget(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[PoisonBudget]:
        client = RedisCluster.from_url(cluster.url)

        async def poison(type_name: str, kind: str) -> None:
            # A list is what a token list is: "list" stores another type (a hash) instead.
            key = tokens_of(prefix, type_name)
            await client.delete(key)
            if kind == "text":
                await client.set(key, "not-a-number")
            else:
                await client.hset(key, "token", "1")

        yield poison
        await client.aclose()


@pytest.mark.parametrize("type_name", ["send-email", "a{b", "has}brace", "}", "{x}", "é", ""])
def test_every_key_of_a_type_shares_one_slot(type_name: str) -> None:
    tag = hash_tag(type_name)
    keys = [
        token_list_key("queuert", tag),
        issued_key("queuert", tag),
        processing_key("queuert", tag, "c0ffee"),
        consumers_key("queuert", tag),
    ]
    assert len({key_slot(key.encode()) for key in keys}) == 1, keys
    assert type_name in keys[0], "names stay readable"


async def test_tokens_of_types_on_every_master_wake_the_consumer_that_listens(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=2)
    mine, theirs = types[::2], types[1::2]
    async with (
        lists_adapter(cluster, prefix) as producer,
        lists_adapter(cluster, prefix) as first,
        lists_adapter(cluster, prefix) as second,
    ):
        first_heard, second_heard = Recorder(), Recorder()
        await first.listen_job_scheduled(mine, first_heard)
        await second.listen_job_scheduled(theirs, second_heard)

        await producer.notify_jobs_scheduled({name: 2 for name in types})
        await first_heard.wait_for(2 * len(mine), within=5)
        await second_heard.wait_for(2 * len(theirs), within=5)
        await asyncio.sleep(0.3)  # a wrong or extra wake would arrive now

        assert sorted(first_heard.calls) == sorted([(name,) for name in mine] * 2)
        assert sorted(second_heard.calls) == sorted([(name,) for name in theirs] * 2)
        for type_name in types:  # held by the consumer that heard it, none left over
            owner = first if type_name in mine else second
            assert [await owner.consume_wake_hint(type_name) for _ in range(3)] == [
                True,
                True,
                False,
            ]


async def test_a_push_runs_one_script_per_slot_on_the_slots_master_and_publishes_nothing(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=2)
    async with lists_adapter(cluster, prefix) as producer:
        before = {port: cluster.command_calls(port) for port in cluster.masters()}
        await producer.notify_jobs_scheduled({name: 3 for name in types})
        after = {port: cluster.command_calls(port) for port in cluster.masters()}
    for port in cluster.masters():
        ran = {name: after[port].get(name, 0) - before[port].get(name, 0) for name in after[port]}
        slots = {
            key_slot(tokens_of(prefix, t).encode())
            for t in types
            if cluster.owner_of(tokens_of(prefix, t)) == port
        }
        assert ran.get("evalsha", 0) == len(slots)
        assert ran.get("publish", 0) == ran.get("spublish", 0) == 0


async def test_one_blocking_connection_per_slot_listened_to_on_the_slots_master(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """Types of one slot share a blocking connection (BLMPOP over them); every other
    slot costs one more, on the master serving it."""
    single = types_on_every_master(cluster, prefix, per_master=1)
    shared = _two_types_in_one_slot(prefix)
    slots = {key_slot(tokens_of(prefix, t).encode()) for t in shared}
    expected: dict[int, int] = dict.fromkeys(cluster.masters(), 0)
    for type_name in single:
        expected[cluster.owner_of(tokens_of(prefix, type_name))] += 1
    for slot in slots:
        expected[cluster.slot_owner(slot)] += 1
    async with (
        lists_adapter(cluster, prefix) as consumer,
        lists_adapter(cluster, prefix) as producer,
    ):
        heard = Recorder()
        unsubscribe = await consumer.listen_job_scheduled([*single, *shared], heard)

        def blocked() -> dict[int, int]:
            return {port: cluster.blocked_movers(port) for port in cluster.masters()}

        await wait_until(lambda: blocked() == expected, timeout=5)
        await producer.notify_jobs_scheduled({name: 1 for name in [*single, *shared]})
        await heard.wait_for(len(single) + 2, within=5)
        assert sorted(heard.calls) == sorted((name,) for name in [*single, *shared])

        await unsubscribe()  # a lane's connection closes with its last type
        await wait_until(lambda: not any(blocked().values()), timeout=5)


def _two_types_in_one_slot(prefix: str) -> list[str]:
    seen: dict[int, str] = {}
    for index in range(100_000):
        name = f"pair-{index}"
        slot = key_slot(tokens_of(prefix, name).encode())
        if slot in seen:
            return [seen[slot], name]
        seen[slot] = name
    raise AssertionError("no two names share a slot")


async def test_a_token_passed_over_on_one_slot_holds_up_no_token_of_another_slot(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """Every lane's blocking move waits for the same free slots: a token the worker heard
    while its slots were busy (it passed it over) is offered to it again once one is
    free, and once consumed no longer keeps a token of another slot where it is."""
    first, second, _ = types_on_every_master(cluster, prefix, per_master=1)
    async with (
        lists_adapter(cluster, prefix) as worker,
        lists_adapter(cluster, prefix) as producer,
    ):
        heard = Recorder()
        await worker.listen_job_scheduled([first, second], heard)
        await worker.acknowledge_wakes(heard, 1)
        await producer.notify_jobs_scheduled({first: 1})
        await heard.wait_for(1, within=5)
        await worker.acknowledge_wakes(heard, 0)  # heard while its claim filled the slot
        await worker.acknowledge_wakes(heard, 1)  # the next pass claimed anyway

        await heard.wait_for(2, within=5)
        assert await worker.consume_wake_hint(first) is True
        await worker.acknowledge_wakes(heard, 1)
        await producer.notify_jobs_scheduled({second: 1})
        await heard.wait_for(3, within=5)
        assert heard.calls == [(first,), (first,), (second,)]


async def test_a_busy_listener_on_one_slot_holds_up_no_token_another_listener_wants(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    """Two workers on one adapter, their types on two slots: the busy worker's token is
    not moved for the idle worker's slot, and the idle worker's is."""
    first, second, _ = types_on_every_master(cluster, prefix, per_master=1)
    async with (
        lists_adapter(cluster, prefix) as shared,
        lists_adapter(cluster, prefix) as producer,
    ):
        busy, idle = Recorder(), Recorder()
        await shared.listen_job_scheduled([first], busy)
        owner = cluster.owner_of(tokens_of(prefix, first))
        # Blocked while the listener has not reported (it wants every token until then).
        await wait_until(lambda: cluster.blocked_movers(owner) == 1, timeout=5)
        await shared.acknowledge_wakes(busy, 0)
        await shared.listen_job_scheduled([second], idle)
        await shared.acknowledge_wakes(idle, 1)

        await producer.notify_jobs_scheduled({first: 1})
        await producer.notify_jobs_scheduled({second: 1})

        await idle.wait_for(1, within=5)
        assert idle.calls == [(second,)]
        assert busy.calls == []
        await shared.acknowledge_wakes(busy, 1)
        await busy.wait_for(1, within=5)
        assert busy.calls == [(first,)]
