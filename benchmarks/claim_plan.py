"""Issue #31: the claim's speed does not depend on the planner's statistics.

Each round fills fresh Postgres tables with ``--jobs`` pending jobs spread over
``--types`` types (untimed), either leaving the jobs table never analyzed (autovacuum
off for it) or running ``ANALYZE`` after the fill, then drains them with one loop that
claims ``--limit`` jobs of all the types at a time and completes them, timing every
claim. Compare the jobs/s of the two; on a plan that sorted the backlog per claim the
claim time would grow with the backlog.

Also the claim statement's own server time (issue #28, "Past one machine"): before
the drain, ``--explains`` claims on the full backlog run under ``EXPLAIN ANALYZE`` and
are rolled back; their planning plus execution time is what the server spends on one
claim of ``--limit`` jobs, without the round trip or the client (pg_stat_statements
would give the same figure, but it is not loaded on a default server).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from benchmarks import runner, stacks
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer

NAME = "claim-plan"
HELP = "drain of 20,000 jobs of two types on a never-analyzed vs an analyzed table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds")
    parser.add_argument("--jobs", type=int, default=20_000, help="pending jobs to drain")
    parser.add_argument("--types", type=int, default=2, help="job types claimed together")
    parser.add_argument("--limit", type=int, default=10, help="jobs per claim")
    parser.add_argument(
        "--explains", type=int, default=50, help="claims timed by EXPLAIN ANALYZE, rolled back"
    )
    stacks.add_stack_arguments(parser)


def _variant(args: argparse.Namespace, analyzed: bool) -> runner.Variant:
    async def run() -> runner.Figures:
        async with stacks.open_stack("postgres", "noop", args) as stack:
            state = stack.state
            jobs_table = f"{stack.prefix}_jobs"
            async with stack.engine.begin() as conn:
                await conn.execute(
                    text(f"ALTER TABLE {jobs_table} SET (autovacuum_enabled = false)")
                )
            types = [f"type-{n}" for n in range(args.types)]
            notes = NotificationBuffer()
            for first in range(0, args.jobs, 1_000):
                chains = [
                    NewChain(NewJob(types[n % len(types)], {"n": n}))
                    for n in range(first, min(first + 1_000, args.jobs))
                ]
                await state.start_chains(chains, notes=notes)
            if analyzed:
                async with stack.engine.connect() as conn:
                    await conn.execute(text(f"ANALYZE {jobs_table}"))
                    await conn.commit()
            server = [
                await _claim_server_ms(stack, types, args.limit) for _ in range(args.explains)
            ]
            claims: list[float] = []
            started = time.perf_counter()
            while True:
                before = time.perf_counter()
                jobs = await state.acquire(types, worker_id="w", lease_seconds=60, limit=args.limit)
                claims.append(time.perf_counter() - before)
                if not jobs:
                    break
                done = [Completion(j.id, j.lease_token or "", None) for j in jobs]
                await state.complete_jobs(done, notes=notes)
            elapsed = time.perf_counter() - started
            server_ms = statistics.median(server) if server else float("nan")
            return {
                "jobs/s": args.jobs / elapsed,
                **runner.percentiles(claims),
                "claim server p50 ms": server_ms,
                "claim server µs/job": 1000 * server_ms / args.limit,
            }

    return runner.Variant("analyzed" if analyzed else "never analyzed", run)


async def explain_claim(
    state: SqlAlchemyStateAdapter, types: list[str], limit: int, *, buffers: bool = False
) -> dict[str, Any]:
    """The JSON document of ``EXPLAIN ANALYZE`` of one claim of ``limit`` jobs of
    ``types`` as the adapter sends it, rolled back (so nothing is claimed). With
    ``buffers`` each node also says how many pages it read."""
    now = datetime.now(UTC)
    query = state.database.sql.claim(
        types, worker_id="w", leased_until=now + timedelta(seconds=60), limit=limit, now=now
    )
    compiled = query.statement.compile(dialect=state.engine.dialect)
    options = "ANALYZE, BUFFERS, FORMAT JSON" if buffers else "ANALYZE, FORMAT JSON"
    async with state.engine.connect() as conn:
        plan = await conn.exec_driver_sql(
            f"EXPLAIN ({options}) " + str(compiled), {**compiled.params, **query.params}
        )
        (document,) = plan.scalar_one()
        await conn.rollback()
    return dict(document)


async def _claim_server_ms(stack: stacks.Stack, types: list[str], limit: int) -> float:
    """Planning plus execution time of one claim the adapter sends."""
    document = await explain_claim(stack.state, types, limit)
    return float(document["Planning Time"]) + float(document["Execution Time"])


async def run(args: argparse.Namespace) -> str:
    variants = [_variant(args, analyzed=False), _variant(args, analyzed=True)]
    results = await runner.alternate(variants, args.rounds, warmup=0)
    rows = results.all_medians()
    ratio = results.ratio("never analyzed", "analyzed")["jobs/s"]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return runner.report(
        f"Claims of {args.types} types on a never-analyzed table, {args.jobs:,} jobs",
        [runner.table(rows)],
        notes=[
            f"never analyzed / analyzed, jobs/s: {ratio:.2f} (median of per-round ratios)",
            f"one loop: claim {args.limit} jobs of {args.types} types, complete them; "
            f"latency of every claim; {args.rounds} rounds, medians; measured {stamp}",
            runner.machine_notes(),
        ],
    )
