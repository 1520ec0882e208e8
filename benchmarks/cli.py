"""Command line of the benchmarks: one subcommand per benchmark module."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType

from benchmarks import (
    churn,
    claim_plan,
    cli_start,
    dashboard,
    django_enqueue,
    drain,
    health_cost,
    held_horizon,
    herd,
    instrumentation_cost,
    limited_claim,
    limits,
    notify_overhead,
    peer_queues,
    pgbouncer,
    prune_impact,
    redis_cost,
    session_enqueue,
    start_throughput,
    steady_state,
    sync_publish,
    sync_start,
    wake_hints,
    wake_latency,
    wake_modes,
    wake_path,
)

BENCHMARKS: tuple[ModuleType, ...] = (
    start_throughput,
    sync_start,
    sync_publish,
    session_enqueue,
    django_enqueue,
    drain,
    limits,
    limited_claim,
    steady_state,
    wake_latency,
    wake_path,
    herd,
    redis_cost,
    notify_overhead,
    wake_hints,
    instrumentation_cost,
    wake_modes,
    dashboard,
    prune_impact,
    peer_queues,
    churn,
    pgbouncer,
    health_cost,
    claim_plan,
    held_horizon,
    cli_start,
)
"""Every benchmark module; each has NAME, HELP, add_arguments(parser) and async run(args)."""


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure queuert-notify; prints a markdown section for docs/benchmarks.md.",
    )
    commands = top.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for module in BENCHMARKS:
        sub = commands.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return top


async def run_benchmark(argv: Sequence[str]) -> str:
    """Run the benchmark ``argv`` names and return its markdown report."""
    args = parser().parse_args(argv)
    run: Callable[[argparse.Namespace], Awaitable[str]] = args.run
    return await run(args)


def main(argv: Sequence[str] | None = None) -> None:
    print(asyncio.run(run_benchmark(sys.argv[1:] if argv is None else argv)))
