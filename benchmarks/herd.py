"""Issue #5: how many workers query SQL when a few jobs arrive for a crowd of idle ones.

``--workers`` idle workers (separate :class:`Worker` instances, concurrency 1,
60 s poll interval; each with a Redis adapter of its own, see
``stacks.SHARED_NOTIFY_KINDS`` for the others) listen; then ``--jobs`` jobs are committed in one
transaction. Counted: SQL claim statements executed from that commit until
every job completed and ``--settle`` seconds passed, per job. With wake
hints (Redis, in-process, NATS with JetStream KV) only as many workers as
there are jobs should claim; a hint-less adapter (Postgres NOTIFY) wakes all of
them; the noop adapter wakes nobody, so its workers poll every
``--noop-poll-interval``.

Claims are counted at the SQL driver (``before_cursor_execute``), whatever
code path sent them; a round that counts fewer claims than jobs means the
claim statement changed shape and :func:`is_claim` no longer recognises it,
and fails instead of reporting a number that flatters.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from contextlib import AsyncExitStack
from typing import Any

from benchmarks import runner, stacks
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

NAME = "herd"
HELP = "SQL claim statements per job when a few jobs wake a crowd of idle workers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per combination")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=8, help="jobs committed in one transaction")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds counted after the end")
    parser.add_argument("--noop-poll-interval", type=float, default=1.0)
    stacks.add_stack_arguments(parser)
    parser.set_defaults(notify="noop,in-process,redis,postgres,nats")


_SETS_LEASED_BY = re.compile(r"\bleased_by\s*=\s*(%\(|\?|:)", re.IGNORECASE)


def is_claim(statement: str, parameters: Any) -> bool:
    """The claim of the SQLAlchemy state adapter: the only statement that sets
    ``leased_by`` to a bound worker id (``state_adapters/statements/queue.py``, ``claim``)."""
    return _SETS_LEASED_BY.search(statement) is not None


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    poll_interval = args.noop_poll_interval if notify_kind == "noop" else 60.0

    async def one_round() -> runner.Figures:
        completions = stacks.Completions(args.jobs)

        async with (
            stacks.open_stack(state_kind, notify_kind, args) as stack,
            AsyncExitStack() as workers,
        ):
            claimers: dict[str, int] = {}
            all_claimed = asyncio.Event()  # every worker made its start-up claim

            def claim(statement: str, parameters: Any) -> bool:
                if not is_claim(statement, parameters):
                    return False
                # The claim binds the worker id: count who asked, not only how often.
                values = parameters.values() if isinstance(parameters, dict) else parameters
                for value in values:
                    if isinstance(value, str) and value in claimers:
                        claimers[value] += 1
                if len(claimers) == args.workers and all(claimers.values()):
                    all_claimed.set()
                return True

            claims = stack.count_statements(claim)
            for _ in range(args.workers):
                worker = Worker(
                    await stack.new_client(),
                    {"bench-herd": _noop},
                    concurrency=1,
                    poll_interval=poll_interval,
                    on_event=completions,
                )
                claimers[worker.worker_id] = 0
                await workers.enter_async_context(worker)
            async with asyncio.timeout(60):
                await all_claimed.wait()
            await asyncio.sleep(0.3)  # and went to sleep: no start-up in the count
            claims.count = 0
            claimers.update(dict.fromkeys(claimers, 0))
            await stack.client.start_chains([ChainSpec("bench-herd") for _ in range(args.jobs)])
            async with asyncio.timeout(poll_interval * 3 + 10):
                await completions.done.wait()
            await asyncio.sleep(args.settle)
            counted = claims.count
            asked = sum(1 for count in claimers.values() if count)
        if counted < args.jobs or asked == 0:
            raise RuntimeError(
                f"{stack.label}: counted {counted} claim statements from {asked} workers for "
                f"{args.jobs} jobs; benchmarks.herd.is_claim no longer matches the claim "
                "statement of state_adapters/statements/queue.py"
            )
        return {
            "claim statements": counted,
            "claims per job": counted / args.jobs,
            "workers that claimed": asked,
        }

    name = stacks.label(state_kind, notify_kind)
    if notify_kind == "noop":
        name += f" (poll {poll_interval:g} s)"
    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(state, notify, args) for state, notify in stacks.combinations(args)]
    rows = await runner.medians(variants, args.rounds, warmup=0)
    return runner.report(
        "Herd",
        [
            f"Medians of {args.rounds} alternating rounds; {args.workers} idle workers "
            f"(concurrency 1), {args.jobs} jobs committed in one transaction; claim "
            f"statements from the commit to the last completion + {args.settle:g} s:",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=[
            "wake hints: in-process, Redis and NATS (JetStream KV) honour them; Postgres "
            "NOTIFY has none (every listener wakes) and noop wakes nobody (polling only)",
            await stacks.server_notes(args),
            runner.machine_notes(),
        ],
    )
