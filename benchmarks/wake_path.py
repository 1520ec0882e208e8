"""Issue #17: where a wakeup's milliseconds go, step by step.

The same workload as the peers' wake latency (one idle worker, concurrency 1, 60 s
poll interval; a chain started in its own transaction after a random gap; latency
from the ``start_chain`` call), with the moment each step of the path was reached,
all in this process:

- ``committed``: the state adapter's ``start_chains`` returned (INSERT and COMMIT);
- ``start returned``: ``start_chain`` returned to the caller;
- ``announced``: the worker's notify listener got the wakeup (``WakePolicy.announced``);
- ``budget granted``: the wake budget granted the worker a unit (``hint_granted``);
- ``claim called``: the worker's loop called the claim (``Claimer.claim``), so the
  step's cost is the hand-over from the grant to the claim;
- ``claimed``: the claim returned the job;
- ``handler``: the handler's first line.

Each column is the median over the round's samples of the time from the call to that
step; the step's own cost is the difference to the column before. The steps are
observed by wrapping those methods for the benchmark's duration, which adds about a
microsecond to each.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import runner, stacks
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.claimer import Claimer
from queuert_notify.worker.wake.policy import WakePolicy
from queuert_notify.worker.worker import Worker

NAME = "wake-path"
HELP = "the wake latency split into its steps: commit, publish, budget, claim, handler"

_TYPE = "bench-wake"
STEPS = (
    "committed",
    "start returned",
    "announced",
    "budget granted",
    "claim called",
    "claimed",
    "handler",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per combination")
    parser.add_argument("--samples", type=int, default=200, help="jobs per round")
    parser.add_argument("--min-gap", type=float, default=0.01, help="seconds between jobs, min")
    parser.add_argument("--max-gap", type=float, default=0.05, help="seconds between jobs, max")
    stacks.add_stack_arguments(parser)
    parser.set_defaults(state="postgres,sqlite", notify="in-process,redis,redis-lists,postgres")


class _Marks:
    """When each step of the current sample was first reached."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def reach(self, step: str) -> None:
        self.at.setdefault(step, time.perf_counter())


@contextmanager
def _observed(marks: _Marks, state: Any) -> Iterator[None]:
    """The path's methods, wrapped to mark their steps; restored afterwards."""
    patches: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, step: str, *, called: str | None = None) -> None:
        """Mark ``step`` when the method returns (a plain method: when it is called),
        and ``called`` when it is called."""
        original = getattr(owner, name)
        patches.append((owner, name, original))
        if asyncio.iscoroutinefunction(original):

            async def awaited(*args: Any, **kwargs: Any) -> Any:
                if called is not None:
                    marks.reach(called)
                result = await original(*args, **kwargs)
                marks.reach(step)
                return result

            setattr(owner, name, awaited)
        else:

            def plain(*args: Any, **kwargs: Any) -> Any:
                marks.reach(step)
                return original(*args, **kwargs)

            setattr(owner, name, plain)

    wrap(state, "start_chains", "committed")
    wrap(WakePolicy, "announced", "announced")
    wrap(WakePolicy, "hint_granted", "budget granted")
    wrap(Claimer, "claim", "claimed", called="claim called")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            if owner is state:
                delattr(owner, name)  # the instance attribute hid the class's method
            else:
                setattr(owner, name, original)


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    async def one_round() -> runner.Figures:
        async with stacks.open_stack(state_kind, notify_kind, args, pool_size=6) as stack:
            marks = _Marks()
            arrived = asyncio.Event()

            async def handler(job: Job, ctx: JobContext) -> None:
                marks.reach("handler")
                arrived.set()

            worker = Worker(
                await stack.new_client(), {_TYPE: handler}, concurrency=1, poll_interval=60.0
            )
            samples: list[dict[str, float]] = []
            with _observed(marks, stack.client.state):
                async with worker:
                    await asyncio.sleep(0.5)  # past the worker's start and first poll
                    for _ in range(args.samples):
                        await asyncio.sleep(random.uniform(args.min_gap, args.max_gap))
                        marks.at.clear()
                        arrived.clear()
                        called = time.perf_counter()
                        await stack.client.start_chain(_TYPE)
                        marks.reach("start returned")
                        async with asyncio.timeout(30):
                            await arrived.wait()
                        samples.append({s: (t - called) * 1000 for s, t in marks.at.items()})
        return _medians(samples)

    return runner.Variant(stacks.label(state_kind, notify_kind), one_round)


def _medians(samples: list[dict[str, float]]) -> runner.Figures:
    """Per step reached in every sample, the median ms from the call to it."""
    steps = [s for s in STEPS if all(s in sample for sample in samples)]
    return {f"{step} ms": statistics.median(sample[step] for sample in samples) for step in steps}


def _costs(rows: dict[str, runner.Figures]) -> dict[str, runner.Figures]:
    """Each step's own cost: its time minus the step before's."""
    costs: dict[str, runner.Figures] = {}
    for name, figures in rows.items():
        previous = 0.0
        costs[name] = {}
        for column, value in figures.items():
            costs[name][column] = value - previous
            previous = value
    return costs


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(s, n, args) for s, n in stacks.combinations(args) if n != "noop"]
    rows = await runner.medians(variants, args.rounds)
    return runner.report(
        "Where a wakeup's time goes",
        [
            f"Medians of {args.rounds} alternating rounds of {args.samples} samples; one idle "
            f"worker, random gaps {args.min_gap * 1000:g} to {args.max_gap * 1000:g} ms; "
            "milliseconds from the `start_chain` call until each step was reached:",
            runner.table(rows, first_column="state + notify"),
            "Each step's own cost (milliseconds since the step before):",
            runner.table(_costs(rows), first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
