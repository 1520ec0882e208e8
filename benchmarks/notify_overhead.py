"""Issue #7: what RedisNotifyAdapter costs over bare redis-py, and what an idle listener costs.

Latency and throughput: the adapter (``notify_chain_completed`` to a
``listen_chain_completed`` callback) against bare redis-py (``PUBLISH`` on
one client, ``PubSub.listen()`` on another) on the same server, one round of
each in turn. Latency: publish one message, wait for it to arrive, repeat;
measured from just before the publish call to the callback. Throughput:
``--publishers`` tasks publish ``--messages`` messages in all, each awaiting
its own publishes; publishes/s counted to the last arrival.

Memory: ``--listeners`` ``listen_chain_completed`` registrations on distinct
chain ids (one shared callback; the ids exist beforehand), measured with
tracemalloc around the registrations, for the in-process and Redis adapters.
The unsubscribe handles the caller keeps are part of the cost.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import suppress

from redis.asyncio import Redis

from benchmarks import runner, services
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe
from queuert_notify.notify.redis import RedisNotifyAdapter

NAME = "notify-overhead"
HELP = "RedisNotifyAdapter vs bare redis-py: latency, publishes/s; memory per idle listener"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="recorded rounds per side")
    parser.add_argument("--samples", type=int, default=1000, help="latency samples per round")
    parser.add_argument("--messages", type=int, default=20000, help="messages per throughput round")
    parser.add_argument("--publishers", type=int, default=8, help="concurrent publishing tasks")
    parser.add_argument("--listeners", type=int, default=10000, help="idle chain listeners")
    parser.add_argument("--redis-url", default=services.redis_url())


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
        async with asyncio.timeout(30):
            await self._reached.wait()


class _Path:
    """One way of getting a message from a publisher to a listener in this process."""

    def __init__(self, publish: Callable[[], Awaitable[object]], receiver: _Receiver) -> None:
        self.publish = publish
        self.receiver = receiver

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


async def _adapter_path(adapter: RedisNotifyAdapter) -> tuple[_Path, Unsubscribe]:
    receiver = _Receiver()
    unsubscribe = await adapter.listen_chain_completed("bench-chain", receiver)

    async def publish() -> None:
        await adapter.notify_chain_completed("bench-chain")

    return _Path(publish, receiver), unsubscribe


class _BareRedis:
    """What a developer writes with redis-py alone: PUBLISH, and a task iterating
    ``PubSub.listen()`` on a second connection."""

    def __init__(self, url: str, channel: str) -> None:
        self._channel = channel
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


async def _listener_memory(adapter: NotifyAdapter, listeners: int) -> runner.Figures:
    """Bytes allocated per idle registration, and bytes still held after unsubscribing."""
    chain_ids = [f"chain-{index:08d}" for index in range(listeners)]

    def callback() -> None:
        """Never called: the listeners stay idle."""

    # Subscribe the channel first so the one-off transport subscription is not counted.
    first = await adapter.listen_chain_completed("warm-up", callback)
    gc.collect()
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
    await first()
    return {"bytes per listener": held / listeners, "bytes held after all left": retained}


async def run(args: argparse.Namespace) -> str:
    prefix = services.unique_prefix()
    adapter = RedisNotifyAdapter(url=args.redis_url, prefix=prefix)
    bare = _BareRedis(args.redis_url, f"{prefix}:bare")
    try:
        await adapter.connect()
        adapter_path, unsubscribe = await _adapter_path(adapter)
        bare_path = await bare.start()
        paths = {"RedisNotifyAdapter": adapter_path, "bare redis-py": bare_path}

        def variant(name: str, path: _Path) -> runner.Variant:
            async def one_round() -> runner.Figures:
                return {
                    **await path.latency_round(args.samples),
                    **await path.throughput_round(args.messages, args.publishers),
                }

            return runner.Variant(name, one_round)

        results = await runner.alternate(
            [variant(name, path) for name, path in paths.items()], args.rounds
        )
        await unsubscribe()
        redis_version = await services.redis_server_version(args.redis_url)
    finally:
        await bare.close()
        await adapter.close()
        await services.delete_redis_prefix(args.redis_url, prefix)

    memory = {
        "InProcessNotifyAdapter": await _memory_rounds(InProcessNotifyAdapter, args),
        "RedisNotifyAdapter": await _memory_rounds(
            lambda: RedisNotifyAdapter(url=args.redis_url, prefix=prefix), args
        ),
    }
    await services.delete_redis_prefix(args.redis_url, prefix)

    rows = {name: results.medians(name) for name in paths}
    rows["ratio adapter / bare"] = results.ratio("RedisNotifyAdapter", "bare redis-py")
    return runner.report(
        "Notify adapter overhead (#7)",
        [
            f"Publish→listener, medians of {args.rounds} alternating rounds "
            f"({args.samples} sequential samples; {args.messages} messages from "
            f"{args.publishers} publishers for publishes/s):",
            runner.table(rows),
            f"Idle chain listeners ({args.listeners:,} `listen_chain_completed` registrations, "
            "tracemalloc, median of 3):",
            runner.table(memory, first_column="adapter"),
        ],
        notes=[
            "ratio is the median of per-round ratios (each pair ran back to back); "
            "for publishes/s a ratio below 1 means the adapter is slower",
            "bytes held after all left: the channel's route table keeps its grown hash table "
            "(CPython dicts do not shrink on delete) until the channel's last listener leaves",
            f"Redis {redis_version} on the same host; {runner.machine_notes()}",
        ],
    )


async def _memory_rounds(
    make: Callable[[], NotifyAdapter], args: argparse.Namespace
) -> runner.Figures:
    rounds = []
    for _ in range(3):
        async with make() as adapter:
            rounds.append(await _listener_memory(adapter, args.listeners))
    return {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
