"""Issue #1: how fast chains can be started, one per transaction and 100 per transaction.

Three ways, one task, one after another, on fresh tables each round:

- ``own tx``: ``client.start_chain(...)`` without a session (the client's own
  transaction, the wakeup published after its commit);
- ``caller tx``: the application's ``AsyncSession`` transaction with one
  ``start_chain(..., session=s)`` in it (the wakeup published from the
  after-commit hook);
- ``100/tx``: ``client.start_chains([...100 specs])`` (one transaction, one
  notify round trip per batch).
"""

from __future__ import annotations

import argparse
import time

from sqlalchemy.ext.asyncio import AsyncSession

from benchmarks import runner, stacks
from queuert_notify.client import ChainSpec

NAME = "start"
HELP = "chains/s started one per transaction and 100 per transaction"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds per combination")
    parser.add_argument("--chains", type=int, default=1000, help="chains started one per tx")
    parser.add_argument("--batches", type=int, default=50, help="transactions of 100 chains")
    stacks.add_stack_arguments(parser)


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    async def one_round() -> runner.Figures:
        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            client = stack.client
            started = time.perf_counter()
            for index in range(args.chains):
                await client.start_chain("bench-start", {"n": index})
            own = args.chains / (time.perf_counter() - started)

            started = time.perf_counter()
            for index in range(args.chains):
                async with AsyncSession(stack.engine) as session, session.begin():
                    await client.start_chain("bench-start", {"n": index}, session=session)
            caller = args.chains / (time.perf_counter() - started)

            batch = [ChainSpec("bench-start", {"n": index}) for index in range(100)]
            started = time.perf_counter()
            for _ in range(args.batches):
                await client.start_chains(batch)
            batched = args.batches * 100 / (time.perf_counter() - started)
        return {"own tx chains/s": own, "caller tx chains/s": caller, "100/tx chains/s": batched}

    return runner.Variant(stacks.label(state_kind, notify_kind), one_round)


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(state, notify, args) for state, notify in stacks.combinations(args)]
    results = await runner.alternate(variants, args.rounds)
    rows = {variant.name: results.medians(variant.name) for variant in variants}
    return runner.report(
        "Start throughput",
        [
            f"Medians of {args.rounds} alternating rounds; {args.chains:,} chains one per "
            f"transaction, {args.batches} transactions of 100, one task:",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
