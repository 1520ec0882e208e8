"""Issue #4: how long an idle worker takes to start a job after its chain was committed.

One worker (concurrency 1, ``--poll-interval`` 60 s) idles; the producer, a
separate client, starts a chain in its own transaction. Latency runs from
``start_chain`` returning (the commit is done and the wakeup published) to the
first line of the handler. After each job completes the producer waits a
random gap (``--min-gap`` to ``--max-gap``), so wakeups never fall into a
rhythm with the worker's loop.

The noop adapter has no notifications: its worker finds jobs only by polling,
so it runs with ``--noop-poll-interval`` and ``--noop-samples`` (a 60 s poll
would take hours), and its gaps are drawn over a whole poll interval so jobs
land at random points of the worker's polling cycle: its latency is about half
that poll interval.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from benchmarks import runner, stacks
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

NAME = "wake-latency"
HELP = "commit→handler start latency of an idle worker with a 60 s poll interval"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per combination")
    parser.add_argument("--samples", type=int, default=200, help="jobs per round")
    parser.add_argument("--poll-interval", type=float, default=60.0)
    parser.add_argument("--min-gap", type=float, default=0.02, help="seconds between jobs, min")
    parser.add_argument("--max-gap", type=float, default=0.1, help="seconds between jobs, max")
    parser.add_argument("--noop-poll-interval", type=float, default=1.0)
    parser.add_argument("--noop-samples", type=int, default=20)
    stacks.add_stack_arguments(parser)


class WakeProbe:
    """When each chain's handler started and when its job completed, for a wake-latency
    loop: pass :meth:`handler` and :meth:`on_event` to a worker of one job type, then
    await :meth:`arrival` and :meth:`completion` of each chain started. Each future is
    created by whichever side gets there first (the handler can start before
    ``start_chain`` has returned)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arrivals: dict[str, asyncio.Future[float]] = {}
        self._completions: dict[str, asyncio.Future[None]] = {}

    def arrival(self, chain_id: str) -> asyncio.Future[float]:
        """When the chain's handler started (``time.perf_counter()``)."""
        return self._arrivals.setdefault(chain_id, self._loop.create_future())

    def completion(self, chain_id: str) -> asyncio.Future[None]:
        """Done once the chain's job completed."""
        return self._completions.setdefault(chain_id, self._loop.create_future())

    def on_event(self, event: WorkerEvent) -> None:
        if event.kind == "completed" and event.chain_id is not None:
            self.completion(event.chain_id).set_result(None)

    async def handler(self, job: Job, ctx: JobContext) -> None:
        self.arrival(job.chain_id).set_result(time.perf_counter())


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    polling_only = notify_kind == "noop"
    samples = args.noop_samples if polling_only else args.samples
    poll_interval = args.noop_poll_interval if polling_only else args.poll_interval
    # The next job follows the previous one's completion, and so does the polling
    # worker's next poll: a short gap would always land just before that poll.
    max_gap = args.min_gap + poll_interval if polling_only else args.max_gap

    async def one_round() -> runner.Figures:
        probe = WakeProbe()
        arrival, completion = probe.arrival, probe.completion
        handler, on_event = probe.handler, probe.on_event

        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            worker = Worker(
                await stack.new_client(),
                {"bench-wake": handler},
                concurrency=1,
                poll_interval=poll_interval,
                on_event=on_event,
            )
            latencies = []
            async with worker:
                await asyncio.sleep(0.2)  # past the worker's first poll: it is asleep
                for _ in range(samples):
                    await asyncio.sleep(random.uniform(args.min_gap, max_gap))
                    chain = await stack.client.start_chain("bench-wake")
                    committed = time.perf_counter()
                    async with asyncio.timeout(poll_interval * 3 + 5):
                        handler_started = await arrival(chain.id)
                        # Idle again before the next gap starts: nothing queues behind it.
                        await completion(chain.id)
                    latencies.append(max(0.0, handler_started - committed))
        return runner.percentiles(latencies)

    name = stacks.label(state_kind, notify_kind)
    if polling_only:
        name += f" (poll {poll_interval:g} s)"
    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(state, notify, args) for state, notify in stacks.combinations(args)]
    rows = await runner.medians(variants, args.rounds, warmup=0)
    return runner.report(
        "Wake latency",
        [
            f"Medians over {args.rounds} alternating rounds of each round's percentiles; "
            f"{args.samples} jobs per round, random gaps {args.min_gap * 1000:g} to "
            f"{args.max_gap * 1000:g} ms, poll interval {args.poll_interval:g} s (noop: "
            f"{args.noop_samples} jobs, poll interval {args.noop_poll_interval:g} s, gaps up "
            "to a poll interval longer):",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
