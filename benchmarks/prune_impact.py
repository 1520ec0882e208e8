"""Issue #15: what retention costs the queue while it runs.

Each round fills fresh tables with ``--finished`` chains of one job each that
finished 30 days ago (untimed, by ``INSERT ... SELECT`` in chunks), plus ``--jobs``
pending no-op jobs before each drain (then ``ANALYZE``), and drains them twice with one
worker (``--concurrency`` slots), measuring every claim the worker makes (the
``acquire`` call; on SQLite ``complete_and_acquire``, which writes the previous
completions and claims in one transaction):

- ``idle``: the drain alone;
- ``pruning``: the drain while ``queuert-notify prune --older-than 1d`` runs in
  another process, deleting the finished chains in paced batches (the drain starts
  once the first batches are gone, and the report says how many chains the prune
  deleted by the drain's end).

The drains run in that order within a round, after an unrecorded warm-up drain (of
up to 1,000 jobs), on the same tables (the earlier drains' jobs stay, completed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Integer, String, cast, func, insert, literal, select
from sqlalchemy.sql import false

from benchmarks import runner, stacks
from benchmarks.drain import fill
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

NAME = "prune-impact"
HELP = "p99 claim latency of a drain while retention deletes 1,000,000 finished jobs"

_CHUNK = 100_000
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds")
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished jobs to prune")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs each drain runs")
    parser.add_argument("--concurrency", type=int, default=10)
    stacks.add_stack_arguments(parser)


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


class _TimedClaims:
    """The stack's state adapter, with the duration of every claim call recorded."""

    def __init__(self, state: Any, samples: list[float]) -> None:
        self._state = state
        self._samples = samples

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self._state.acquire(*args, **kwargs)
        finally:
            self._samples.append(time.perf_counter() - started)

    async def complete_and_acquire(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self._state.complete_and_acquire(*args, **kwargs)
        finally:
            if kwargs.get("limit"):
                self._samples.append(time.perf_counter() - started)


async def fill_finished(stack: stacks.Stack, count: int) -> None:
    """``count`` chains of one completed job each, finished 30 days ago."""
    chains, jobs = stack.state.tables.chains, stack.state.tables.jobs
    long_ago = datetime.now(UTC) - timedelta(days=30)
    for start in range(0, count, _CHUNK):
        size = min(_CHUNK, count - start)
        numbers = select(literal(start + 1).label("i")).cte("numbers", recursive=True)
        numbers = numbers.union_all(
            select((numbers.c.i + 1).label("i")).where(numbers.c.i < start + size)
        )
        if stack.state_kind == "sqlite":
            ident: Any = func.printf("%032d", numbers.c.i)
        else:
            ident = func.lpad(cast(numbers.c.i, String), 32, "0")
        ids = select(ident.label("id")).subquery()
        at = literal(long_ago, chains.c.created_at.type)
        async with stack.engine.begin() as conn:
            await conn.execute(
                insert(chains).from_select(
                    ["id", "type_name", "created_at", "completed_at", "has_dependents"],
                    select(ids.c.id, literal("old"), at, at, false()),
                )
            )
            await conn.execute(
                insert(jobs).from_select(
                    [
                        "id",
                        "chain_id",
                        "chain_index",
                        "type_name",
                        "status",
                        "priority",
                        "created_at",
                        "scheduled_at",
                        "completed_at",
                        "attempt",
                        "blockers_pending",
                    ],
                    select(
                        ids.c.id,
                        ids.c.id,
                        literal(0, Integer),
                        literal("old"),
                        literal("completed"),
                        literal(0, Integer),
                        at,
                        at,
                        at,
                        literal(1, Integer),
                        literal(0, Integer),
                    ),
                )
            )


async def _remaining(stack: stacks.Stack) -> int:
    chains = stack.state.tables.chains
    async with stack.engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).where(chains.c.type_name == "old")))


async def _first_batches_gone(
    stack: stacks.Stack, finished: int, prune: asyncio.subprocess.Process
) -> None:
    """Return once the prune process deleted something (or ended)."""
    for _ in range(6000):
        if prune.returncode is not None or await _remaining(stack) < finished:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the prune process deleted nothing in 5 minutes")


def _database_url(stack: stacks.Stack) -> str:
    return stack.engine.url.render_as_string(hide_password=False)


async def _drain(
    stack: stacks.Stack, args: argparse.Namespace, jobs: int | None = None
) -> runner.Figures:
    jobs = args.jobs if jobs is None else jobs
    await fill(stack, jobs)
    # Statistics that know the backlog, as autovacuum's would: with none, the planner
    # expects no pending job and sorts every one of them at each claim.
    await stack.analyze()
    samples: list[float] = []
    completions = stacks.Completions(jobs)

    client = await stack.new_client()
    timed = type(client)(state=_TimedClaims(stack.state, samples), notify=client.notify)
    worker = Worker(
        timed, {"bench-noop": _noop}, concurrency=args.concurrency, on_event=completions
    )
    started = time.perf_counter()
    async with worker:
        async with asyncio.timeout(max(120.0, jobs / 20)):
            await completions.done.wait()
    elapsed = time.perf_counter() - started
    return {**runner.percentiles(samples), "jobs/s": jobs / elapsed}


async def _round(state_kind: str, args: argparse.Namespace) -> dict[str, runner.Figures]:
    async with stacks.open_stack(
        state_kind, "in-process", args, pool_size=args.concurrency + 4
    ) as stack:
        await fill_finished(stack, args.finished)
        # Warm-up: caches and connections as the later drains find them.
        await _drain(stack, args, min(args.jobs, 1000))
        idle = await _drain(stack, args)
        prune = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "queuert_notify.cli",
            "prune",
            "--older-than",
            "1d",
            "--database-url",
            _database_url(stack),
            "--table-prefix",
            f"{stack.prefix}_",
            cwd=_REPO,
            stdout=asyncio.subprocess.DEVNULL,
        )
        try:
            await _first_batches_gone(stack, args.finished, prune)
            pruning = await _drain(stack, args)
            pruning["pruned by the end"] = float(args.finished - await _remaining(stack))
        finally:
            if prune.returncode is None:
                prune.terminate()
            await asyncio.wait_for(prune.wait(), 30)
    return {"idle": idle, "pruning": pruning}


async def run(args: argparse.Namespace) -> str:
    states = sorted({state for state, _ in stacks.combinations(args)})
    rows: dict[str, runner.Figures] = {}
    ratios: dict[str, runner.Figures] = {}
    for state_kind in states:
        rounds = [await _round(state_kind, args) for _ in range(args.rounds)]
        label = stacks.label(state_kind, "in-process")
        results = runner.Results(
            {f"{label}, {name}": [r[name] for r in rounds] for name in ("idle", "pruning")}
        )
        for name in ("idle", "pruning"):
            rows[f"{label}, {name}"] = results.medians(f"{label}, {name}")
        pruning_only = {
            k: v for k, v in rows[f"{label}, pruning"].items() if k != "pruned by the end"
        }
        ratios[label] = {
            k: pruning_only[k] / rows[f"{label}, idle"][k] for k in ("p50 ms", "p99 ms", "jobs/s")
        }
    return runner.report(
        "Retention's cost to a concurrent drain",
        [
            f"Medians of {args.rounds} rounds; {args.finished:,} finished one-job chains "
            f"(30 days old) in the tables; each drain runs {args.jobs:,} no-op jobs with one "
            f"worker (concurrency {args.concurrency}); latency of every claim call; "
            "`pruning`: `queuert-notify prune --older-than 1d` runs in another process "
            "meanwhile:",
            runner.table(rows, first_column="state, drain"),
            "Pruning / idle:",
            runner.table(ratios, first_column="state"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
