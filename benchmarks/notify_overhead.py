"""Issues #5 (item 7), #7 and #8: what each notify adapter costs, side by side.

Publish→listener: for every adapter, ``notify_chain_completed`` on a
publishing adapter to a ``listen_chain_completed`` callback on a listening
one (two adapters with connections of their own, as in two processes; one
instance for the in-process adapter, which reaches only itself), next to
bare redis-py (``PUBLISH`` on one client, ``PubSub.listen()`` on another) on
the same Redis server. Every variant runs once per round, the order rotating
each round. Latency: publish one message, wait for it to arrive, repeat;
measured from just before the publish call to the callback. Throughput:
``--publishers`` tasks publish ``--messages`` messages in all, each awaiting
its own publishes; publishes/s counted to the last arrival.

Wake hints, for the adapters that keep budgets: ``provide_wake_hint(t, 1)``
followed by ``consume_wake_hint(t)``, ``--hint-pairs`` pairs from one task and
again from ``--hint-tasks`` tasks over ``--hint-types`` types (on the cluster
the types spread over the masters); and ``notify_jobs_scheduled`` with three
types, the call every committing transaction makes.

Memory: ``--listeners`` ``listen_chain_completed`` registrations on distinct
chain ids (one shared callback; the ids exist beforehand), measured with
tracemalloc around the registrations, median of 3 fresh adapters. The
unsubscribe handles the caller keeps are part of the cost.

Redis Cluster: a local cluster of 3 masters with one replica each
(``tests/support/redis_cluster.py``), started for the run on free loopback ports and
killed afterwards; nothing else on the machine is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import statistics
import subprocess
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from importlib import metadata

from redis.asyncio import Redis

from benchmarks import runner, services
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter

NAME = "notify-overhead"
HELP = (
    "every notify adapter side by side (and RedisNotifyAdapter vs bare redis-py): "
    "publish→listener latency, publishes/s, wake hints/s, memory per idle listener"
)

ADAPTERS = ("in-process", "redis", "redis-cluster", "postgres", "nats")
_BARE = "bare redis-py"
_BARE_BOUNDED = "bare redis-py, get_message(timeout=1)"
_SINGLE, _CLUSTER = "RedisNotifyAdapter", "RedisNotifyAdapter(cluster=True)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="recorded rounds per variant")
    parser.add_argument("--samples", type=int, default=1000, help="latency samples per round")
    parser.add_argument("--messages", type=int, default=20000, help="messages per throughput round")
    parser.add_argument("--publishers", type=int, default=8, help="concurrent publishing tasks")
    parser.add_argument("--hint-pairs", type=int, default=2000, help="provide+consume pairs")
    parser.add_argument("--hint-tasks", type=int, default=16, help="tasks in the parallel run")
    parser.add_argument("--hint-types", type=int, default=8, help="types the tasks spread over")
    parser.add_argument("--listeners", type=int, default=10000, help="idle chain listeners")
    parser.add_argument(
        "--adapters",
        default=",".join(ADAPTERS),
        help=f"comma-separated: {', '.join(ADAPTERS)} (bare redis-py runs with redis)",
    )
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--nats-url", default=services.nats_url())


# -- the adapters under test ---------------------------------------------------------


@dataclass(frozen=True)
class _Transport:
    """How to build adapters of one kind; ``shared``: in memory, so the publisher and
    the listener must be one instance; ``hints``: it keeps wake budgets."""

    label: str
    make: Callable[[], NotifyAdapter]
    shared: bool = False
    hints: bool = True


@asynccontextmanager
async def _transports(args: argparse.Namespace, prefix: str) -> AsyncIterator[list[_Transport]]:
    """The chosen transports, with the servers they need; afterwards, what they left
    under ``prefix`` is deleted and a cluster started here is killed."""
    async with AsyncExitStack() as exits:
        kinds = runner.choices(args.adapters, ADAPTERS, "--adapters")
        yield [await _transport(kind, args, prefix, exits) for kind in kinds]


async def _transport(
    kind: str, args: argparse.Namespace, prefix: str, exits: AsyncExitStack
) -> _Transport:
    if kind == "in-process":
        return _Transport("InProcessNotifyAdapter", InProcessNotifyAdapter, shared=True)
    if kind == "postgres":
        from queuert_notify.notify.postgres import PostgresNotifyAdapter

        return _Transport(
            "PostgresNotifyAdapter",
            lambda: PostgresNotifyAdapter(args.postgres_url, prefix=prefix),
            hints=False,
        )
    if kind == "nats":
        from queuert_notify.notify.nats import NatsNotifyAdapter, default_bucket

        exits.push_async_callback(
            services.delete_nats_bucket, args.nats_url, default_bucket(prefix)
        )
        return _Transport(
            "NatsNotifyAdapter", lambda: NatsNotifyAdapter(args.nats_url, prefix=prefix)
        )
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

    if kind == "redis":
        exits.push_async_callback(services.delete_redis_prefix, args.redis_url, prefix)
        return _Transport(_SINGLE, lambda: RedisNotifyAdapter(url=args.redis_url, prefix=prefix))
    cluster_url = (await exits.enter_async_context(services.local_redis_cluster())).url
    return _Transport(
        _CLUSTER, lambda: RedisNotifyAdapter(cluster_url, prefix=prefix, cluster=True)
    )


# -- publish → listener --------------------------------------------------------------


class _Receiver:
    """Counts arrivals and wakes whoever waits for the n-th one."""

    def __init__(self) -> None:
        self.arrivals = 0
        self.last_arrival = 0.0
        self._target = 0
        self._reached: asyncio.Event = asyncio.Event()

    def expect(self, total: int) -> None:
        """Reset; :meth:`wait` returns once ``total`` more messages arrived."""
        self.arrivals = 0
        self._target = total
        self._reached = asyncio.Event()

    def __call__(self) -> None:
        self.last_arrival = time.perf_counter()
        self.arrivals += 1
        if self.arrivals >= self._target:
            self._reached.set()

    async def wait(self) -> None:
        async with asyncio.timeout(60):
            await self._reached.wait()


@dataclass
class _Path:
    """One way of getting a message from a publisher to a listener in this process."""

    publish: Callable[[], Awaitable[object]]
    receiver: _Receiver

    async def latency_round(self, samples: int) -> runner.Figures:
        latencies = []
        for _ in range(samples):
            self.receiver.expect(1)
            started = time.perf_counter()
            await self.publish()
            await self.receiver.wait()
            latencies.append(self.receiver.last_arrival - started)
        return runner.percentiles(latencies)

    async def throughput_round(self, messages: int, publishers: int) -> runner.Figures:
        self.receiver.expect(messages)
        share, extra = divmod(messages, publishers)

        async def publisher(count: int) -> None:
            for _ in range(count):
                await self.publish()

        started = time.perf_counter()
        await asyncio.gather(*(publisher(share + (i < extra)) for i in range(publishers)))
        await self.receiver.wait()
        return {"publishes/s": messages / (self.receiver.last_arrival - started)}

    def variant(self, name: str, args: argparse.Namespace) -> runner.Variant:
        async def one_round() -> runner.Figures:
            return {
                **await self.latency_round(args.samples),
                **await self.throughput_round(args.messages, args.publishers),
            }

        return runner.Variant(name, one_round)


async def _adapter_path(transport: _Transport, exits: AsyncExitStack) -> _Path:
    """A listener on one adapter and a publisher on another (the same for in-memory)."""
    listener = await exits.enter_async_context(transport.make())
    publisher = listener
    if not transport.shared:
        publisher = await exits.enter_async_context(transport.make())
    receiver = _Receiver()
    exits.push_async_callback(await listener.listen_chain_completed("bench-chain", receiver))

    async def publish() -> None:
        await publisher.notify_chain_completed("bench-chain")

    return _Path(publish, receiver)


class _BareRedis:
    """What a developer writes with redis-py alone: PUBLISH, and a task iterating
    ``PubSub.listen()`` on a second connection; with ``bounded_wait``, a task
    calling ``get_message(timeout=1.0)`` instead, the way the adapter's reader
    waits (so a dead connection is noticed and an idle reader never spins)."""

    def __init__(self, url: str, channel: str, *, bounded_wait: bool = False) -> None:
        self._channel = channel
        self._bounded_wait = bounded_wait
        self._commands = Redis.from_url(url)
        self._subscriber = Redis.from_url(url)
        self._pubsub = self._subscriber.pubsub(ignore_subscribe_messages=True)
        self.receiver = _Receiver()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> _Path:
        await self._pubsub.subscribe(self._channel)
        # Read the confirmation before anything is published, as the adapter does.
        await self._pubsub.get_message(timeout=5.0)
        self._reader = asyncio.create_task(self._read())
        return _Path(self._publish, self.receiver)

    async def _publish(self) -> None:
        await self._commands.publish(self._channel, "bench-chain")

    async def _read(self) -> None:
        if self._bounded_wait:
            while True:
                message = await self._pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "message":
                    self.receiver()
        else:
            async for message in self._pubsub.listen():
                if message["type"] == "message":
                    self.receiver()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with suppress(asyncio.CancelledError):
                await self._reader
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._subscriber.aclose()
        await self._commands.aclose()


async def _publish_listen(
    transports: Sequence[_Transport], args: argparse.Namespace, prefix: str
) -> runner.Results:
    async with AsyncExitStack() as exits:
        variants = [
            (await _adapter_path(transport, exits)).variant(transport.label, args)
            for transport in transports
        ]
        if any(t.label == _SINGLE for t in transports):
            for name, bounded_wait in ((_BARE, False), (_BARE_BOUNDED, True)):
                channel = f"{prefix}:bare:{int(bounded_wait)}"
                bare = _BareRedis(args.redis_url, channel, bounded_wait=bounded_wait)
                exits.push_async_callback(bare.close)
                variants.append((await bare.start()).variant(name, args))
        return await runner.alternate(variants, args.rounds)


# -- wake hints ----------------------------------------------------------------------


async def _rate(call: Callable[[int], Awaitable[object]], calls: int, tasks: int) -> float:
    """Calls per second when ``tasks`` tasks make ``calls`` awaited calls in all; task
    i passes i to every call it makes."""
    share, extra = divmod(calls, tasks)

    async def caller(index: int, count: int) -> None:
        for _ in range(count):
            await call(index)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i, share + (i < extra)) for i in range(tasks)))
    return calls / (time.perf_counter() - started)


async def _hint_variant(
    transport: _Transport, args: argparse.Namespace, exits: AsyncExitStack
) -> runner.Variant:
    adapter = await exits.enter_async_context(transport.make())
    types = [f"bench-hint-{index}" for index in range(args.hint_types)]
    three_types = dict.fromkeys(types[:3], 1)

    async def pair(task: int) -> None:
        type_name = types[task % len(types)]
        await adapter.provide_wake_hint(type_name, 1)
        await adapter.consume_wake_hint(type_name)

    async def schedule(task: int) -> None:
        await adapter.notify_jobs_scheduled(three_types)

    async def one_round() -> runner.Figures:
        pairs, tasks = args.hint_pairs, args.hint_tasks
        return {
            "pairs/s, 1 task": await _rate(pair, pairs, 1),
            f"pairs/s, {tasks} tasks": await _rate(pair, pairs, tasks),
            "notify_jobs_scheduled(3 types)/s": await _rate(schedule, pairs, 1),
        }

    return runner.Variant(transport.label, one_round)


async def _wake_hints(transports: Sequence[_Transport], args: argparse.Namespace) -> runner.Results:
    hinted = [transport for transport in transports if transport.hints]
    if not hinted:
        return runner.Results()
    async with AsyncExitStack() as exits:
        variants = [await _hint_variant(transport, args, exits) for transport in hinted]
        return await runner.alternate(variants, args.rounds)


# -- memory per idle listener -------------------------------------------------------


async def _listener_memory(adapter: NotifyAdapter, listeners: int) -> runner.Figures:
    """Bytes allocated per idle registration, and bytes still held after unsubscribing."""
    chain_ids = [f"chain-{index:08d}" for index in range(listeners)]

    def callback() -> None:
        """Never called: the listeners stay idle."""

    # Subscribe the channel first so the one-off transport subscription is not counted.
    first = await adapter.listen_chain_completed("warm-up", callback)
    gc.collect()
    # The collections below then walk only what the listeners allocated, not the whole
    # heap (a full one took ~0.1 s each in a test process). A heap frozen already (the
    # test suite's) is left as it is.
    frozen_already = gc.get_freeze_count() > 0
    if not frozen_already:
        gc.freeze()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [await adapter.listen_chain_completed(cid, callback) for cid in chain_ids]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        for handle in handles:
            await handle()
        del handles
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        if not frozen_already:
            gc.unfreeze()
    await first()
    return {"bytes per listener": held / listeners, "bytes held after all left": retained}


async def _memory(transport: _Transport, listeners: int) -> runner.Figures:
    rounds = []
    for _ in range(3):
        async with transport.make() as adapter:
            rounds.append(await _listener_memory(adapter, listeners))
    return {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}


# -- the report --------------------------------------------------------------------


async def run(args: argparse.Namespace) -> str:
    prefix = services.unique_prefix()
    async with _transports(args, prefix) as transports:
        latency = await _publish_listen(transports, args, prefix)
        hints = await _wake_hints(transports, args)
        memory = {t.label: await _memory(t, args.listeners) for t in transports}
        notes = await _server_notes(args)

    sections = [
        f"Publish→listener (`notify_chain_completed` → `listen_chain_completed`), medians "
        f"of {args.rounds} alternating rounds ({args.samples} sequential samples; "
        f"{args.messages} messages from {args.publishers} publishers for publishes/s):",
        runner.table(
            _rows(
                latency,
                (_SINGLE, _BARE, "adapter / bare"),
                (_BARE_BOUNDED, _BARE, "get_message(timeout=1) / listen(), both bare"),
            ),
            first_column="adapter",
        ),
    ]
    if hints.rounds:
        sections += [
            f"Wake hints, medians of {args.rounds} alternating rounds ({args.hint_pairs} "
            f"`provide_wake_hint` + `consume_wake_hint` pairs; {args.hint_tasks} tasks over "
            f"{args.hint_types} types; `notify_jobs_scheduled` from one task):",
            runner.table(_rows(hints), first_column="adapter"),
        ]
    sections += [
        f"Idle chain listeners ({args.listeners:,} `listen_chain_completed` registrations, "
        "tracemalloc, median of 3):",
        runner.table(memory, first_column="adapter"),
    ]
    return runner.report(
        "Notify adapters side by side",
        sections,
        notes=[
            "a ratio is the median of per-round ratios (each pair ran back to back); for "
            "publishes/s and hints/s a ratio below 1 means the first is slower",
            "publisher and listener are separate adapters with connections of their own "
            "(one instance for in-process); bare redis-py publishes and listens on two "
            "connections too, reading with listen() or, like the adapter's reader, with "
            "get_message(timeout=1)",
            "bytes held after all left: the channel's route table keeps its grown hash table "
            "(CPython dicts do not shrink on delete) until the channel's last listener leaves",
            *notes,
        ],
    )


def _rows(results: runner.Results, *ratios: tuple[str, str, str]) -> dict[str, runner.Figures]:
    """Medians per variant, then ``ratio <label>`` rows for each ``(numerator,
    denominator, label)`` that ran, and cluster / single node when both ran."""
    rows = results.all_medians()
    for top, bottom, label in (*ratios, (_CLUSTER, _SINGLE, "cluster / single node")):
        if {top, bottom} <= results.rounds.keys():
            rows[f"ratio {label}"] = results.ratio(top, bottom)
    return rows


async def _server_notes(args: argparse.Namespace) -> list[str]:
    """Versions of the servers the chosen adapters used, and the machine."""
    chosen = runner.choices(args.adapters, ADAPTERS, "--adapters")
    servers = []
    if "redis" in chosen:
        servers.append(f"Redis {await services.redis_server_version(args.redis_url)}")
    if "redis-cluster" in chosen:
        servers.append(
            f"Redis Cluster: 3 masters + 3 replicas of the local redis-server "
            f"{_local_redis_version()} on loopback ports"
        )
    if "postgres" in chosen:
        servers.append(f"Postgres {await services.postgres_server_version(args.postgres_url)}")
    if "nats" in chosen:
        servers.append(f"nats-server {await _nats_server_version(args.nats_url)}")
    return [
        "; ".join(servers) + " on the same host",
        f"nats-py {_version('nats-py')}; {runner.machine_notes()}",
    ]


async def _nats_server_version(url: str) -> str:
    import nats

    connection = await nats.connect(url)
    try:
        version = connection.connected_server_version
        return f"{version.major}.{version.minor}.{version.patch}"
    finally:
        await connection.close()


def _local_redis_version() -> str:
    """The version of the ``redis-server`` on PATH (the one the local cluster runs)."""
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"v=(\S+)", out)
    return match.group(1) if match else "?"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"
