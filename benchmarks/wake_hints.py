"""Wake-hint Lua throughput: how many budget operations per second Redis takes.

``consume_wake_hint`` is what every woken worker calls before it queries SQL,
so its rate bounds how fast a crowd of workers can be told yes or no. Each
variant runs ``--calls`` calls one after another (round trips/s) and again
from ``--concurrency`` tasks at once; a bare redis-py PING, the cheapest
round trip there is, runs in the same rounds as the floor to compare with.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from benchmarks import runner, services
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

NAME = "wake-hints"
HELP = "consume/provide wake hint and notify_jobs_scheduled calls/s vs a bare PING"

_HUGE_BUDGET = 10**12  # never exhausted during a run: every consume takes a unit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="recorded rounds per variant")
    parser.add_argument("--calls", type=int, default=5000, help="calls per measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="tasks in the parallel run")
    parser.add_argument("--redis-url", default=services.redis_url())


async def _rate(call: Callable[[], Awaitable[object]], calls: int, tasks: int) -> float:
    """Calls per second when ``tasks`` tasks make ``calls`` awaited calls in all."""
    share, extra = divmod(calls, tasks)

    async def caller(count: int) -> None:
        for _ in range(count):
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(caller(share + (i < extra)) for i in range(tasks)))
    return calls / (time.perf_counter() - started)


def _variant(
    name: str, call: Callable[[], Awaitable[object]], args: argparse.Namespace
) -> runner.Variant:
    async def one_round() -> runner.Figures:
        return {
            "sequential calls/s": await _rate(call, args.calls, 1),
            f"{args.concurrency} tasks calls/s": await _rate(call, args.calls, args.concurrency),
        }

    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    prefix = services.unique_prefix()
    adapter = RedisNotifyAdapter(url=args.redis_url, prefix=prefix)
    bare = Redis.from_url(args.redis_url)
    try:
        await adapter.connect()
        await adapter.provide_wake_hint("bench-consume", _HUGE_BUDGET)
        three_types = {"bench-a": 1, "bench-b": 1, "bench-c": 1}
        variants = [
            _variant(
                "consume_wake_hint (budget left)",
                lambda: adapter.consume_wake_hint("bench-consume"),
                args,
            ),
            _variant(
                "consume_wake_hint (no budget)",
                lambda: adapter.consume_wake_hint("bench-missing"),
                args,
            ),
            _variant("provide_wake_hint", lambda: adapter.provide_wake_hint("bench-p", 1), args),
            _variant(
                "notify_jobs_scheduled (3 types)",
                lambda: adapter.notify_jobs_scheduled(three_types),
                args,
            ),
            _variant("bare redis-py PING", bare.ping, args),
        ]
        results = await runner.alternate(variants, args.rounds)
        redis_version = await services.redis_server_version(args.redis_url)
    finally:
        await bare.aclose()
        await adapter.close()
        await services.delete_redis_prefix(args.redis_url, prefix)

    rows = results.all_medians()
    return runner.report(
        "Wake-hint Lua throughput",
        [
            f"Medians of {args.rounds} alternating rounds, {args.calls:,} calls per figure:",
            runner.table(rows, first_column="call"),
        ],
        notes=[
            "every adapter call is one EVALSHA round trip; PING is the floor of a round trip",
            f"Redis {redis_version} on the same host; {runner.machine_notes()}",
        ],
    )
