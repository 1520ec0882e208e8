"""Issue #31: what the health report costs on a big queue.

Fills fresh tables with ``--finished`` chains of one completed job each (untimed,
``INSERT ... SELECT`` in chunks) and ``--pending`` pending jobs, runs ``ANALYZE``, then
times ``client.health()`` ``--calls`` times per round (after three unrecorded calls)
on each ``--state``. The report reads system views, pragmas and the partial indexes
of unfinished jobs only, so its cost should not follow the finished jobs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

from benchmarks import runner, stacks
from benchmarks.drain import fill
from benchmarks.prune_impact import fill_finished

NAME = "health-cost"
HELP = "client.health() on 1,000,000 finished + 10,000 pending jobs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds")
    parser.add_argument("--calls", type=int, default=50, help="health() calls per round")
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--pending", type=int, default=10_000, help="pending jobs")
    stacks.add_stack_arguments(parser)
    parser.set_defaults(notify="noop")


async def _measure(state_kind: str, args: argparse.Namespace) -> tuple[runner.Figures, str]:
    async with stacks.open_stack(state_kind, "noop", args) as stack:
        await fill_finished(stack, args.finished)
        await fill(stack, args.pending)
        await stack.analyze()
        for _ in range(3):
            await stack.client.health()
        rounds: list[runner.Figures] = []
        for _ in range(args.rounds):
            samples = []
            for _ in range(args.calls):
                started = time.perf_counter()
                report = await stack.client.health()
                samples.append(time.perf_counter() - started)
            rounds.append(runner.percentiles(samples))
        figures = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
        return figures, f"{report.severity}: {report.backlog.pending:,} pending"


async def run(args: argparse.Namespace) -> str:
    rows: dict[str, runner.Figures] = {}
    seen: list[str] = []
    for state_kind in args.state.split(","):
        label = {"postgres": "Postgres", "sqlite": "SQLite"}[state_kind]
        rows[label], outcome = await _measure(state_kind, args)
        seen.append(f"{label}: {outcome}")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return runner.report(
        f"Health report, {args.finished:,} finished + {args.pending:,} pending jobs",
        [runner.table(rows, first_column="database")],
        notes=[
            f"{args.calls} calls of client.health() per round, {args.rounds} rounds, medians "
            f"of each round's percentiles; the report said {'; '.join(seen)}; measured {stamp}",
            runner.machine_notes(),
        ],
    )
