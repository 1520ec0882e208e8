"""``SyncClient``'s blocking publish on one Redis server next to a Redis Cluster, in both
wake modes: what one committed transaction costs its sender thread.

Each variant calls ``publisher.publish(notes)`` (the publisher
``RedisNotifyAdapter.blocking_publisher()`` returns) ``--publishes`` times per round,
for two transactions:

- ``1 type``: one job of one type;
- ``3 types, 3 masters``: one job of each of three types whose keys live on three
  different masters of the cluster, and one completed chain.

Per-publish wall time, median within a round, then median over rounds. The single
server is the shared Redis (``--redis-url``); the cluster (3 masters + 3 replicas)
is started for the run on loopback ports.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from benchmarks import runner, services
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter, WakeMode
from queuert_notify.notify.redis.shared import hash_tag, token_list_key
from state_adapters.notifications import NotificationBuffer

NAME = "sync-publish"
HELP = "SyncClient's blocking publish: one Redis server vs a cluster, both wake modes"
WAKES: tuple[WakeMode, ...] = ("pubsub", "lists")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="recorded rounds")
    parser.add_argument("--publishes", type=int, default=500, help="publishes per round")
    parser.add_argument("--redis-url", default=services.redis_url())


def _notes(types: list[str], completed: bool) -> NotificationBuffer:
    notes = NotificationBuffer()
    for type_name in types:
        notes.job_scheduled(type_name)
    if completed:
        notes.chain_completed(str(uuid.uuid4()))
    return notes


def _variant(name: str, notify: RedisNotifyAdapter, types: list[str], count: int) -> runner.Variant:
    publisher = notify.blocking_publisher()
    one, three = _notes(types[:1], completed=False), _notes(types, completed=True)

    def median_us(notes: NotificationBuffer) -> float:
        samples = []
        for _ in range(count):
            began = time.perf_counter()
            publisher.publish(notes)
            samples.append(time.perf_counter() - began)
        return statistics.median(samples) * 1e6

    async def one_round() -> runner.Figures:
        return {"1 type p50 µs": median_us(one), "3 types, 3 masters p50 µs": median_us(three)}

    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    prefix = services.unique_prefix()
    async with services.local_redis_cluster() as cluster:
        # One type per master (token lists and budget keys of a type share its slot).
        owners: dict[int, str] = {}
        index = 0
        while len(owners) < 3:
            name = f"bench-{index}"
            index += 1
            owners.setdefault(cluster.owner_of(token_list_key(prefix, hash_tag(name))), name)
        types = list(owners.values())
        variants = []
        for wake in WAKES:
            server = RedisNotifyAdapter(args.redis_url, prefix=prefix, wake=wake)
            on_cluster = RedisNotifyAdapter(cluster.url, prefix=prefix, cluster=True, wake=wake)
            variants += [
                _variant(f"one server, wake={wake}", server, types, args.publishes),
                _variant(f"cluster, wake={wake}", on_cluster, types, args.publishes),
            ]
        try:
            results = await runner.alternate(variants, args.rounds)
        finally:
            await services.delete_redis_prefix(args.redis_url, prefix)
    rows = results.all_medians()
    for wake in WAKES:
        rows[f"wake={wake}: cluster / one server"] = results.ratio(
            f"cluster, wake={wake}", f"one server, wake={wake}"
        )
    return runner.report(
        "SyncClient's publish: one Redis server next to a cluster",
        [
            f"Medians of {args.rounds} alternating rounds of {args.publishes:,} publishes "
            "per transaction shape, one sender thread:",
            runner.table(rows, first_column="publisher"),
        ],
        notes=[runner.machine_notes()],
    )
