"""Issue #18: Redis Pub/Sub wake hints vs durable wake tokens on lists, side by side.

Each round measures both modes of ``RedisNotifyAdapter`` (``wake="pubsub"`` and
``wake="lists"``) on the same state backend (``--state``, default Postgres):

- **wake latency**: one idle worker (concurrency 1, 60 s poll); ``--samples`` chains
  started one at a time with random gaps of 20-100 ms; from ``start_chain`` returning
  to the handler's first line (p50, p99).
- **claims per job under a herd**: ``--workers`` idle workers (concurrency 1, 60 s
  poll, an adapter each) and ``--jobs`` jobs committed in one transaction; SQL claim
  statements counted at the driver from the commit until the last completion (+0.5 s).
- **wakeups lost across a worker restart**: the only worker stops; ``--restart-chains``
  chains are started one by one while it is down; a new worker (a new adapter) starts.
  Counted: wakeups its adapter delivers for them (a callback registered on the new
  adapter before the worker starts); lost = chains - delivered. Jobs are not lost in
  either mode (the new worker's start-up claim finds them): this counts the wakeups.
- **Redis connections per worker**: connections the server lists under the worker's
  own client name (``?client_name=`` in its URL) while it idles.
- **bytes per queued wake**: ``MEMORY USAGE`` of what 1,000 wakes of one type leave
  on the server before anyone consumes them (the budget key; the token list and its
  marker), divided by 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from contextlib import AsyncExitStack

from redis.asyncio import Redis

from benchmarks import herd, runner, stacks
from benchmarks.wake_latency import WakeProbe
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter, WakeMode
from queuert_notify.notify.redis.shared import hint_key, issued_key, token_list_key
from queuert_notify.worker.worker import Worker

NAME = "wake-modes"
HELP = "Redis Pub/Sub wake hints vs wake tokens on lists: latency, herd, restart, cost"

MODES: dict[str, WakeMode] = {"redis": "pubsub", "redis-lists": "lists"}
QUEUED_WAKES = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per mode")
    parser.add_argument("--samples", type=int, default=100, help="wake-latency jobs per round")
    parser.add_argument("--workers", type=int, default=32, help="idle workers of the herd")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of the herd's burst")
    parser.add_argument("--restart-chains", type=int, default=20)
    stacks.add_stack_arguments(parser)
    parser.set_defaults(state="postgres", notify="redis,redis-lists")


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _named(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}client_name={name}"


async def _latency(stack: stacks.Stack, wake: WakeMode, args: argparse.Namespace) -> runner.Figures:
    probe = WakeProbe()
    arrival, completion = probe.arrival, probe.completion
    handler, on_event = probe.handler, probe.on_event

    latencies = []
    notify = RedisNotifyAdapter(stack.args.redis_url, prefix=stack.prefix, wake=wake)
    async with (
        Client(state=stack.state, notify=notify) as client,
        Worker(client, {"bench-wake": handler}, concurrency=1, poll_interval=60, on_event=on_event),
    ):
        await asyncio.sleep(0.2)  # past the worker's first poll: it is asleep
        for _ in range(args.samples):
            await asyncio.sleep(random.uniform(0.02, 0.1))
            chain = await stack.client.start_chain("bench-wake")
            committed = time.perf_counter()
            async with asyncio.timeout(30):
                started = await arrival(chain.id)
                await completion(chain.id)
            latencies.append(max(0.0, started - committed))
    figures = runner.percentiles(latencies)
    return {"wake p50 ms": figures["p50 ms"], "wake p99 ms": figures["p99 ms"]}


async def _herd(stack: stacks.Stack, wake: WakeMode, args: argparse.Namespace) -> runner.Figures:
    completions = stacks.Completions(args.jobs)

    claims = stack.count_statements(herd.is_claim)
    async with AsyncExitStack() as crowd:
        for _ in range(args.workers):
            notify = RedisNotifyAdapter(stack.args.redis_url, prefix=stack.prefix, wake=wake)
            client = await crowd.enter_async_context(Client(state=stack.state, notify=notify))
            await crowd.enter_async_context(
                Worker(client, {"bench-herd": _noop}, concurrency=1, on_event=completions)
            )
        await asyncio.sleep(0.5)  # every worker made its start-up claim and sleeps
        claims.count = 0
        await stack.client.start_chains([ChainSpec("bench-herd") for _ in range(args.jobs)])
        async with asyncio.timeout(180):
            await completions.done.wait()
        await asyncio.sleep(0.5)
    return {"claims per job": claims.count / args.jobs}


async def _restart(stack: stacks.Stack, wake: WakeMode, args: argparse.Namespace) -> runner.Figures:
    name = f"{stack.prefix}-worker"
    url = _named(stack.args.redis_url, name)
    types = {"bench-restart": _noop}
    admin = Redis.from_url(stack.args.redis_url, decode_responses=True)
    try:
        first = RedisNotifyAdapter(url, prefix=stack.prefix, wake=wake)
        async with Client(state=stack.state, notify=first) as client, Worker(client, types):
            await asyncio.sleep(0.3)
            clients = await admin.client_list()
            connections = sum(1 for c in clients if c.get("name") == name)
        # The only worker is down: these wakeups find nobody listening.
        for _ in range(args.restart_chains):
            await stack.client.start_chain("bench-restart")
        delivered = 0

        def heard(type_name: str) -> None:
            nonlocal delivered
            delivered += 1

        second = RedisNotifyAdapter(url, prefix=stack.prefix, wake=wake)
        async with Client(state=stack.state, notify=second) as client:
            await second.listen_job_scheduled(list(types), heard)
            async with Worker(client, types):
                for _ in range(200):
                    counts = await client.count_jobs(type_names=list(types))
                    if counts.get("completed", 0) == args.restart_chains:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
    finally:
        await admin.aclose()
    return {
        "wakeups lost across a restart": max(args.restart_chains - delivered, 0),
        "Redis connections per worker": connections,
    }


async def _memory(stack: stacks.Stack, wake: WakeMode) -> runner.Figures:
    type_name = "bench-memory"
    notify = RedisNotifyAdapter(stack.args.redis_url, prefix=stack.prefix, wake=wake)
    admin = Redis.from_url(stack.args.redis_url)
    try:
        async with notify:
            await notify.notify_jobs_scheduled({type_name: QUEUED_WAKES})
        keys = (
            [token_list_key(stack.prefix, type_name), issued_key(stack.prefix, type_name)]
            if wake == "lists"
            else [hint_key(stack.prefix, type_name)]
        )
        used = sum([int(await admin.memory_usage(key) or 0) for key in keys])
    finally:
        await admin.aclose()
    return {"bytes per queued wake": used / QUEUED_WAKES}


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    wake = MODES[notify_kind]

    async def one_round() -> runner.Figures:
        figures: runner.Figures = {}
        for measure in (_latency, _herd, _restart):
            async with stacks.open_stack(state_kind, notify_kind, args) as stack:
                figures.update(await measure(stack, wake, args))
        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            figures.update(await _memory(stack, wake))
        return figures

    return runner.Variant(f"{stacks.label(state_kind, notify_kind)} (wake={wake!r})", one_round)


async def run(args: argparse.Namespace) -> str:
    combos = [(s, n) for s, n in stacks.combinations(args) if n in MODES]
    if not combos:
        raise SystemExit("--notify: choose redis and/or redis-lists")
    variants = [_variant(state, notify, args) for state, notify in combos]
    rows = await runner.medians(variants, args.rounds, warmup=0)
    return runner.report(
        "Redis wake modes: Pub/Sub hints vs list tokens",
        [
            f"Medians of {args.rounds} alternating rounds. Wake latency: {args.samples} jobs, "
            "one idle worker, 60 s poll. Herd: "
            f"{args.workers} idle workers (concurrency 1), {args.jobs} jobs in one transaction. "
            f"Restart: {args.restart_chains} chains started while the only worker was down. "
            f"Memory: {QUEUED_WAKES} queued wakes of one type.",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
