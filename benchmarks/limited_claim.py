"""Issue #15: one claim of a limited type against the plain claim, as a drain sees it.

Each round fills fresh tables with ``--jobs`` pending jobs (then ``ANALYZE``), sets
the variant's limits, and makes ``--claims`` claims of ``--batch`` jobs each through
the state adapter (``acquire``, on its held connections), while a second task
completes what was claimed on connections of its own (``complete_jobs``), committing
meanwhile as a worker's completion batcher does. Only the claims are timed. Variants:

- ``plain``: no limits (the one-statement claim);
- ``concurrency``: ``concurrency`` far above what is running: the type's row locked
  and its running jobs counted on every claim;
- ``concurrency + rate``: also ``rate`` far above the claims' pace: the rate window
  read and the type's row rewritten on every claim.

What the drain benchmark (``limits``) shows as a whole, taken apart per claim.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta
from typing import Any

from benchmarks import runner, stacks
from queuert_notify.client.chain_spec import ChainSpec
from state_adapters.model import Completion, JobRecord
from state_adapters.notifications import NotificationBuffer

NAME = "limited-claim"
HELP = "latency of one claim of a limited type against the plain claim, completions alongside"

_TYPE = "bench-claimed"
_FILL_BATCH = 1000
_LIMITS: dict[str, dict[str, Any]] = {
    "plain": {},
    "concurrency": {"concurrency": 100_000},
    "concurrency + rate": {"concurrency": 100_000, "rate": 100_000, "per": timedelta(seconds=1)},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds per variant")
    parser.add_argument("--claims", type=int, default=500, help="timed claims per round")
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim")
    parser.add_argument("--jobs", type=int, default=8_000, help="backlog size")
    stacks.add_stack_arguments(parser)


def _variant(
    state_kind: str, notify_kind: str, kind: str, args: argparse.Namespace
) -> runner.Variant:
    async def one_round() -> runner.Figures:
        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            for offset in range(0, args.jobs, _FILL_BATCH):
                count = min(_FILL_BATCH, args.jobs - offset)
                await stack.client.start_chains([ChainSpec(_TYPE) for _ in range(count)])
            await stack.analyze()
            if _LIMITS[kind]:
                await stack.client.set_limits(_TYPE, **_LIMITS[kind])
            state = stack.state
            claimed: asyncio.Queue[list[JobRecord] | None] = asyncio.Queue()

            async def complete() -> None:
                while (jobs := await claimed.get()) is not None:
                    completions = [Completion(job.id, job.lease_token or "") for job in jobs]
                    await state.complete_jobs(completions, notes=NotificationBuffer())

            samples: list[float] = []
            completing = asyncio.create_task(complete())
            try:
                async with state.holding_connections():
                    for _ in range(args.claims):
                        began = time.perf_counter()
                        jobs = await state.acquire(
                            [_TYPE], worker_id="bench", lease_seconds=60, limit=args.batch
                        )
                        samples.append(time.perf_counter() - began)
                        claimed.put_nowait(jobs)
            finally:
                claimed.put_nowait(None)
                await completing
        return runner.percentiles(samples)

    return runner.Variant(f"{stacks.label(state_kind, notify_kind)}, {kind}", one_round)


async def run(args: argparse.Namespace) -> str:
    variants = [
        _variant(state, notify, kind, args)
        for state, notify in stacks.combinations(args)
        for kind in _LIMITS
    ]
    results = await runner.alternate(variants, args.rounds, warmup=0)
    rows = results.all_medians()
    ratios = {}
    for state, notify in stacks.combinations(args):
        plain = f"{stacks.label(state, notify)}, plain"
        for kind in list(_LIMITS)[1:]:
            name = f"{stacks.label(state, notify)}, {kind}"
            ratios[name] = {"p50 vs plain": results.ratio(name, plain)["p50 ms"]}
    return runner.report(
        "One limited claim against the plain claim",
        [
            f"Medians of {args.rounds} alternating rounds of {args.claims} claims of "
            f"{args.batch} jobs each from {args.jobs:,} pending, completions committed "
            "alongside on other connections; milliseconds per claim (`acquire`):",
            runner.table(rows, first_column="state + notify, limits"),
            "Claim latency relative to the plain claim (median of the rounds' ratios):",
            runner.table(ratios, first_column="state + notify, limits"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
