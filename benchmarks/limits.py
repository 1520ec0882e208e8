"""Issue #15: what limits cost a drain, side by side with the plain drain.

Each round fills fresh tables with ``--jobs`` pending jobs (untimed, transactions
of 1,000, then ``ANALYZE``), sets the variant's limits, then starts one
:class:`Worker` (``--concurrency`` slots, staged mode, handlers without work) and
measures from its start to the last completion: jobs/s. Variants:

- ``plain``: no limits (one claim statement per claim);
- ``limits not binding``: ``concurrency`` and ``rate`` set far above what the
  worker reaches, so every claim is a limited claim (the type's row locked, its
  running jobs counted, the starts recorded) that never holds a job back;
- ``key_concurrency=1, N keys``: the jobs spread over ``--keys`` concurrency keys,
  at most one running per key (claims walk the keys round robin).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta

from benchmarks import runner, stacks
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

NAME = "limits"
HELP = "jobs/s one worker drains with no limits, limits not binding, key_concurrency=1"

_TYPE = "bench-limited"
_FILL_BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per variant")
    parser.add_argument("--jobs", type=int, default=10_000, help="backlog size")
    parser.add_argument("--keys", type=int, default=100, help="concurrency keys (keyed variant)")
    parser.add_argument("--concurrency", type=int, default=10)
    stacks.add_stack_arguments(parser)


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _variant(
    state_kind: str, notify_kind: str, kind: str, args: argparse.Namespace
) -> runner.Variant:
    jobs = args.jobs

    async def one_round() -> runner.Figures:
        async with stacks.open_stack(
            state_kind, notify_kind, args, pool_size=args.concurrency + 4
        ) as stack:
            client = stack.client
            for offset in range(0, jobs, _FILL_BATCH):
                count = min(_FILL_BATCH, jobs - offset)
                await client.start_chains(
                    [
                        ChainSpec(
                            _TYPE,
                            concurrency_key=f"key-{(offset + n) % args.keys}"
                            if kind == "keyed"
                            else None,
                        )
                        for n in range(count)
                    ]
                )
            await stack.analyze()
            if kind == "not binding":
                await client.set_limits(
                    _TYPE, concurrency=100_000, rate=100_000, per=timedelta(seconds=1)
                )
            elif kind == "keyed":
                await client.set_limits(_TYPE, key_concurrency=1)
            completions = stacks.Completions(jobs)

            worker = Worker(
                await stack.new_client(),
                {_TYPE: _noop},
                concurrency=args.concurrency,
                mode="staged",
                on_event=completions,
            )
            started = time.perf_counter()
            async with worker:
                async with asyncio.timeout(max(120.0, jobs / 20)):
                    await completions.done.wait()
        return {"jobs/s": jobs / (completions.last - started)}

    return runner.Variant(_name(state_kind, notify_kind, kind, args), one_round)


def _name(state_kind: str, notify_kind: str, kind: str, args: argparse.Namespace) -> str:
    limits = {
        "plain": "plain",
        "not binding": "limits not binding",
        "keyed": f"key_concurrency=1, {args.keys} keys",
    }[kind]
    return f"{stacks.label(state_kind, notify_kind)}, {limits}"


async def run(args: argparse.Namespace) -> str:
    kinds = ("plain", "not binding", "keyed")
    variants = [
        _variant(state, notify, kind, args)
        for state, notify in stacks.combinations(args)
        for kind in kinds
    ]
    rows = await runner.medians(variants, args.rounds, warmup=0)
    ratios = {}
    for state, notify in stacks.combinations(args):
        plain = rows[_name(state, notify, "plain", args)]["jobs/s"]
        for kind in kinds[1:]:
            name = _name(state, notify, kind, args)
            ratios[name] = {"time vs plain": plain / rows[name]["jobs/s"]}
    return runner.report(
        "Drain with limits",
        [
            f"Medians of {args.rounds} alternating rounds; {args.jobs:,} jobs, one worker, "
            f"concurrency {args.concurrency}, staged, handlers without work, from worker "
            "start to the last completion:",
            runner.table(rows, first_column="state + notify, limits"),
            "Drain time relative to the plain drain (lower is better):",
            runner.table(ratios, first_column="state + notify, limits"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
