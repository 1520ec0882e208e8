"""``SyncClient`` publishing to a real Redis Cluster, in both wake modes: a committed
start wakes async listeners and workers of types on every master, its budgets or tokens
land in each type's slot (one script per slot), a rolled-back start sends nothing.

The cluster (3 masters, 3 replicas) is started once for this module by the
``redis_cluster`` fixture; Postgres holds the jobs. Sync code runs in a thread
(``asyncio.to_thread``) so the async listeners keep hearing meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from queuert_notify import ChainSpec, Client, ConfigurationError, RedisNotifyAdapter, SyncClient
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.redis.adapter import WakeMode
from queuert_notify.notify.redis.cluster import NOTIFY_JOBS_SCHEDULED_SHARDED, cluster_hint_key
from queuert_notify.notify.redis.shared import PUSH_WAKE_TOKENS, hash_tag, issued_key
from queuert_notify.testing import Recorder
from queuert_notify.worker.worker import Worker
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.services import free_port
from tests.test_redis_cluster_lists import tokens_of, types_on_every_master

pytest_plugins = ["tests.support.queue_fixtures"]
pytestmark = pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)

WAKES = pytest.mark.parametrize("wake", ["pubsub", "lists"])


def adapter(cluster: LocalRedisCluster, prefix: str, wake: WakeMode) -> RedisNotifyAdapter:
    return cluster.adapter(prefix, wake=wake)


def start_in_thread(
    engine: Engine, notify: RedisNotifyAdapter, table_prefix: str, write: Callable[..., Any]
) -> Any:
    """Run ``write(client, engine)`` on a SyncClient in a thread; its ``close()`` sends
    whatever the write owes before this returns."""

    def run() -> Any:
        with SyncClient(engine, notify=notify, table_prefix=table_prefix) as client:
            return write(client, engine)

    return asyncio.to_thread(run)


def wake_units(cluster: LocalRedisCluster, prefix: str, wake: WakeMode, type_name: str) -> int:
    """The budget (pubsub) or the tokens (lists) of ``type_name``, read on the master that
    serves its slot: found elsewhere, it would read 0."""
    key = cluster_hint_key(prefix, type_name) if wake == "pubsub" else tokens_of(prefix, type_name)
    with cluster.node(cluster.owner_of(key)).client() as client:
        if wake == "pubsub":
            return int(client.get(key) or 0)
        return int(client.llen(key))


def script_wrote(cluster: LocalRedisCluster, prefix: str, wake: WakeMode, type_name: str) -> bool:
    """Whether a publish script ran for ``type_name``: its budget key (pubsub) or issue
    marker (lists) exists on the master serving its slot."""
    tag = hash_tag(type_name)
    key = cluster_hint_key(prefix, type_name) if wake == "pubsub" else issued_key(prefix, tag)
    with cluster.node(cluster.owner_of(key)).client() as client:
        return bool(client.exists(key))


def load_script(cluster: LocalRedisCluster, wake: WakeMode) -> None:
    """SCRIPT LOAD the publish script of ``wake`` on every master."""
    text = PUSH_WAKE_TOKENS if wake == "lists" else NOTIFY_JOBS_SCHEDULED_SHARDED
    for port in cluster.masters():
        with cluster.node(port).client() as node:
            node.script_load(text)


def command_calls(cluster: LocalRedisCluster) -> dict[int, dict[str, int]]:
    return {port: cluster.command_calls(port) for port in cluster.masters()}


def ran_since(before: dict[str, int], after: dict[str, int], command: str) -> int:
    return after.get(command, 0) - before.get(command, 0)


@WAKES
async def test_sync_starts_of_types_on_every_master_wake_the_async_listener(
    cluster: LocalRedisCluster, prefix: str, wake: WakeMode, sync_engine: Engine, table_prefix: str
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=2)
    async with adapter(cluster, prefix, wake) as listener:
        heard = Recorder()
        await listener.listen_job_scheduled(types, heard)

        def start_two_of_each(client: SyncClient, engine: Engine) -> None:
            with Session(engine) as session, session.begin():
                client.start_chains(
                    [ChainSpec(t) for t in types for _ in range(2)], session=session
                )

        await start_in_thread(
            sync_engine, adapter(cluster, prefix, wake), table_prefix, start_two_of_each
        )
        # Pub/Sub: one message per type, the count in its budget; lists: one token per job.
        per_type = 1 if wake == "pubsub" else 2
        await heard.wait_for(per_type * len(types), within=5)
        await asyncio.sleep(0.3)  # a wrong or extra wake would arrive now
        assert sorted(heard.calls) == sorted([(t,) for t in types] * per_type)
        for type_name in types:
            taken = [await listener.consume_wake_hint(type_name) for _ in range(3)]
            assert taken == [True, True, False], type_name


@WAKES
async def test_budgets_or_tokens_land_in_each_types_slot_one_script_per_slot(
    cluster: LocalRedisCluster, prefix: str, wake: WakeMode, sync_engine: Engine, table_prefix: str
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=2)

    def start_three_of_each(client: SyncClient, engine: Engine) -> None:
        client.start_chains([ChainSpec(t) for t in types for _ in range(3)])

    notify = adapter(cluster, prefix, wake)
    # Connected first, so the counts below are the publish's alone; and the script on
    # every master: a master without it (a replica put in charge by a failover, which a
    # loaded machine's stall may bring about) costs a NOSCRIPT and a second EVALSHA, the
    # recovery test_a_master_that_lost_the_script_gets_it_again_and_runs_it_once covers.
    await start_in_thread(sync_engine, notify, table_prefix, lambda client, engine: None)
    await asyncio.to_thread(load_script, cluster, wake)
    before = await asyncio.to_thread(command_calls, cluster)
    await start_in_thread(sync_engine, notify, table_prefix, start_three_of_each)
    after = await asyncio.to_thread(command_calls, cluster)

    assert {t: wake_units(cluster, prefix, wake, t) for t in types} == dict.fromkeys(types, 3)
    for port in cluster.masters():
        mine = [t for t in types if cluster.owner_of(tokens_of(prefix, t)) == port]
        slots = {key_slot(tokens_of(prefix, t).encode()) for t in mine}
        ran = {
            name: ran_since(before[port], after[port], name)
            for name in ("evalsha", "spublish", "publish", "command|getkeys")
        }
        assert ran == {
            "evalsha": len(slots),
            # The scripts' own (INFO counts commands run by scripts); none in lists mode.
            "spublish": len(mine) if wake == "pubsub" else 0,
            "publish": 0,
            "command|getkeys": 0,  # routed by the client alone: one round trip
        }, port


@WAKES
async def test_a_start_in_a_rolled_back_transaction_or_savepoint_publishes_nothing(
    cluster: LocalRedisCluster, prefix: str, wake: WakeMode, sync_engine: Engine, table_prefix: str
) -> None:
    async with adapter(cluster, prefix, wake) as listener:
        heard = Recorder()
        await listener.listen_job_scheduled(["dropped", "in-savepoint", "kept"], heard)

        def roll_back_then_commit(client: SyncClient, engine: Engine) -> None:
            with Session(engine) as session:
                session.begin()
                client.start_chain("dropped", session=session)
                session.rollback()
            with Session(engine) as session, session.begin():
                nested = session.begin_nested()
                client.start_chain("in-savepoint", session=session)
                nested.rollback()
                client.start_chain("kept", session=session)

        await start_in_thread(
            sync_engine, adapter(cluster, prefix, wake), table_prefix, roll_back_then_commit
        )
        await heard.wait_for(1, within=5)
        await asyncio.sleep(0.3)
    assert heard.calls == [("kept",)]
    # The scripts write this key on every run (the budget, or the issue marker, which
    # stays when the listener has moved the tokens): its absence says none ran.
    assert [
        script_wrote(cluster, prefix, wake, t) for t in ("dropped", "in-savepoint", "kept")
    ] == [
        False,
        False,
        True,
    ]


async def test_a_sync_cancel_announces_the_chain_on_its_shard_channel(
    cluster: LocalRedisCluster, prefix: str, sync_engine: Engine, table_prefix: str
) -> None:
    async with adapter(cluster, prefix, "pubsub") as listener:

        def start(client: SyncClient, engine: Engine) -> str:
            return client.start_chain("job", delay=3600).id

        chain_id = await start_in_thread(
            sync_engine, adapter(cluster, prefix, "pubsub"), table_prefix, start
        )
        completed = Recorder()
        await listener.listen_chain_completed(chain_id, completed)
        await start_in_thread(
            sync_engine,
            adapter(cluster, prefix, "pubsub"),
            table_prefix,
            lambda client, engine: client.cancel_chain(chain_id),
        )
        await completed.wait_for(1, within=5)


@WAKES
async def test_a_master_that_lost_the_script_gets_it_again_and_runs_it_once(
    cluster: LocalRedisCluster, prefix: str, wake: WakeMode, sync_engine: Engine, table_prefix: str
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=1)

    def start_one_of_each(client: SyncClient, engine: Engine) -> None:
        client.start_chains([ChainSpec(t) for t in types])
        for port in cluster.masters():  # as a restart would
            with cluster.node(port).client() as node:
                node.script_flush()
        client.start_chains([ChainSpec(t) for t in types])

    await start_in_thread(
        sync_engine, adapter(cluster, prefix, wake), table_prefix, start_one_of_each
    )
    assert {t: wake_units(cluster, prefix, wake, t) for t in types} == dict.fromkeys(types, 2)


async def test_an_adapter_on_a_callers_cluster_client_is_refused_naming_url(
    cluster: LocalRedisCluster, sync_engine: Engine, prefix: str, table_prefix: str
) -> None:
    caller_owned = AsyncRedisCluster.from_url(cluster.url)
    try:
        notify = RedisNotifyAdapter(client=caller_owned, prefix=prefix)
        with pytest.raises(ConfigurationError, match=r"built with url=\.\.\."):
            SyncClient(sync_engine, notify=notify, table_prefix=table_prefix)
    finally:
        await caller_owned.aclose()


async def test_an_unreachable_cluster_never_holds_up_the_application(
    sync_engine: Engine, prefix: str, table_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    nobody = RedisNotifyAdapter(f"redis://127.0.0.1:{free_port()}", prefix=prefix, cluster=True)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="queuert_notify.client.sync_announcers"):
        chain = await start_in_thread(
            sync_engine, nobody, table_prefix, lambda client, engine: client.start_chain("job")
        )
    assert time.monotonic() - began < 5.0, "the failed publish is bounded"
    assert "sending a notification" in caplog.text
    with SyncClient(sync_engine, table_prefix=table_prefix) as client:
        assert client.get_chain(chain.id).status == "pending", "the job waits for a poll"


@pytest.mark.parametrize(
    ("notify_kind", "wake"),
    [("redis_cluster", "pubsub"), ("redis_cluster_lists", "lists")],
    indirect=["notify_kind"],
)
async def test_a_worker_runs_sync_started_jobs_of_types_on_every_master_without_polling(
    client: Client,
    cluster: LocalRedisCluster,
    prefix: str,
    wake: WakeMode,
    sync_engine: Engine,
    table_prefix: str,
) -> None:
    types = types_on_every_master(cluster, prefix, per_master=1)

    async def handler(job: Job, ctx: JobContext) -> str:
        return job.type_name

    def start_each(sync_client: SyncClient, engine: Engine) -> list[str]:
        return [chain.id for chain in sync_client.start_chains([ChainSpec(t) for t in types])]

    # The worker polls once a minute: only the wakeups bring the jobs in time.
    async with Worker(client, dict.fromkeys(types, handler), poll_interval=60):
        chain_ids = await start_in_thread(
            sync_engine, adapter(cluster, prefix, wake), table_prefix, start_each
        )
        for chain_id in chain_ids:
            done = await client.await_chain(chain_id, timeout=10, poll_interval=0.05)
            assert done.status == "completed"
