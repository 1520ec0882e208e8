"""Issue #3: producers and workers running at once, for ``--duration`` seconds.

``--producers`` tasks start chains one per transaction, together offering
``--rate`` chains/s on a fixed schedule (0: each as fast as it can), while
``--workers`` workers (concurrency ``--concurrency``, atomic mode, 60 s poll
interval, each with a client of its own) run them; all share one process and
one event loop, as an app with embedded workers would. The noop adapter wakes
nobody, so its workers poll every ``--noop-poll-interval`` seconds instead.

Reported: chains started/s and jobs completed/s (both over the producing
time), latency from ``start_chain`` returning to the ``completed`` event, and
the backlog left when the producers stop. At a rate the workers keep up with,
the latency is what a job waits under load; as fast as possible, completed/s is
the throughput and the backlog says which side is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack

from benchmarks import runner, stacks
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

NAME = "steady"
HELP = "producers + workers at once for 30 s: started/s, completed/s, end-to-end latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per combination")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per round")
    parser.add_argument("--rate", type=float, default=0.0, help="chains/s offered; 0 = max")
    parser.add_argument("--producers", type=int, default=2, help="tasks starting chains")
    parser.add_argument("--workers", type=int, default=2, help="Worker instances")
    parser.add_argument("--concurrency", type=int, default=10, help="slots per worker")
    parser.add_argument("--noop-poll-interval", type=float, default=1.0)
    stacks.add_stack_arguments(parser)


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    poll_interval = args.noop_poll_interval if notify_kind == "noop" else 60.0

    async def one_round() -> runner.Figures:
        returned_at: dict[str, float] = {}
        completed_at: dict[str, float] = {}  # completed before start_chain returned
        latencies: list[float] = []
        completed = 0

        def on_event(event: WorkerEvent) -> None:
            nonlocal completed
            if event.kind == "completed" and event.chain_id is not None:
                completed += 1
                now = time.perf_counter()
                returned = returned_at.pop(event.chain_id, None)
                if returned is None:
                    completed_at[event.chain_id] = now
                else:
                    latencies.append(now - returned)

        async with (
            stacks.open_stack(state_kind, notify_kind, args) as stack,
            AsyncExitStack() as workers,
        ):
            for _ in range(args.workers):
                worker = Worker(
                    await stack.new_client(),
                    {"bench-steady": _noop},
                    concurrency=args.concurrency,
                    poll_interval=poll_interval,
                    on_event=on_event,
                )
                await workers.enter_async_context(worker)
            slots = started = 0
            begin = time.perf_counter()
            end = begin + args.duration

            async def produce() -> None:
                nonlocal slots, started
                while True:
                    # Each producer takes the next slot of the schedule, so together
                    # they offer --rate whatever their number.
                    due = begin + slots / args.rate if args.rate > 0 else time.perf_counter()
                    slots += 1
                    if due >= end:
                        return
                    if (wait := due - time.perf_counter()) > 0:
                        await asyncio.sleep(wait)
                    chain = await stack.client.start_chain("bench-steady")
                    returned = time.perf_counter()
                    started += 1
                    if completed_at.pop(chain.id, None) is None:
                        returned_at[chain.id] = returned
                    else:
                        latencies.append(0.0)  # done before start_chain returned

            await asyncio.gather(*(produce() for _ in range(args.producers)))
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
    rows = await runner.medians(variants, args.rounds, warmup=0)
    offered = f"{args.rate:g} chains/s offered" if args.rate > 0 else "as fast as they can"
    return runner.report(
        "Steady state",
        [
            f"Medians of {args.rounds} alternating rounds of {args.duration:g} s; "
            f"{args.producers} producer tasks ({offered}, one chain per transaction) and "
            f"{args.workers} workers (concurrency {args.concurrency}, atomic mode) in one "
            "process; latency from start_chain returning to the completed event:",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
