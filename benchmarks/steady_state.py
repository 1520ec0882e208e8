"""Issue #3: producers and a worker running at once, for ``--duration`` seconds.

A producer starts chains one per transaction on a fixed schedule of
``--rate`` chains/s (0: as fast as it can), while one worker (concurrency
``--concurrency``, atomic mode, 60 s poll interval) runs them; both share one
process and one event loop, as an app with an embedded worker would. The noop
adapter wakes nobody, so its worker polls every ``--noop-poll-interval``
seconds instead. Reported: chains started/s, jobs completed/s (both over the
run), latency from ``start_chain`` returning to the ``completed`` event, and
the backlog left when the producer stops.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks import runner, stacks
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker import Worker

NAME = "steady"
HELP = "producer + worker at once for 30 s: started/s, completed/s, end-to-end latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per combination")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per round")
    parser.add_argument("--rate", type=float, default=300.0, help="chains/s offered; 0 = max")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--noop-poll-interval", type=float, default=1.0)
    stacks.add_stack_arguments(parser)


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    poll_interval = args.noop_poll_interval if notify_kind == "noop" else 60.0

    async def one_round() -> runner.Figures:
        committed_at: dict[str, float] = {}
        latencies: list[float] = []
        completed = 0

        def on_event(event: WorkerEvent) -> None:
            nonlocal completed
            if event.kind == "completed" and event.chain_id is not None:
                completed += 1
                committed = committed_at.pop(event.chain_id, None)
                if committed is not None:
                    latencies.append(time.perf_counter() - committed)

        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            worker = Worker(
                await stack.new_client(),
                {"bench-steady": _noop},
                concurrency=args.concurrency,
                poll_interval=poll_interval,
                on_event=on_event,
            )
            async with worker:
                started = 0
                begin = time.perf_counter()
                end = begin + args.duration
                while (now := time.perf_counter()) < end:
                    if args.rate > 0 and (due := begin + started / args.rate) > now:
                        await asyncio.sleep(due - now)
                    chain = await stack.client.start_chain("bench-steady")
                    # A job finished before we get here is not in the latency sample.
                    committed_at[chain.id] = time.perf_counter()
                    started += 1
                elapsed = time.perf_counter() - begin
                done = completed
        return {
            "started/s": started / elapsed,
            "completed/s": done / elapsed,
            **runner.percentiles(latencies),
            "backlog at end": started - done,
        }

    name = stacks.label(state_kind, notify_kind)
    if notify_kind == "noop":
        name += f" (poll {poll_interval:g} s)"
    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(state, notify, args) for state, notify in stacks.combinations(args)]
    results = await runner.alternate(variants, args.rounds, warmup=0)
    rows = {variant.name: results.medians(variant.name) for variant in variants}
    offered = f"{args.rate:g} chains/s offered" if args.rate > 0 else "as fast as possible"
    return runner.report(
        "Steady state",
        [
            f"Medians of {args.rounds} alternating rounds of {args.duration:g} s; one producer "
            f"({offered}, one chain per transaction), one worker (concurrency "
            f"{args.concurrency}) in the same process; latency from start_chain returning "
            "to the completed event:",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
