"""Issue #31: the queue while another connection holds back the xmin horizon, and after.

On fresh Postgres tables a producer starts ``--rate`` jobs a second (in ten batches a
second) and one loop drains them (claim up to ``--limit``, complete), for
``--duration`` seconds. From ``--hold-at`` for ``--hold-for`` seconds another
connection holds a REPEATABLE READ snapshot (``BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1``, then idle), as an analytics job or a forgotten shell would; then it ends
and the run vacuums the jobs and chains tables once, as autovacuum (with the tables'
settings of migration 0008) would within its naptime (the report says whether the
server's autovacuum is on; a shared test server may run without it). Every second
the run records the jobs claimed, the claims' p99, the jobs table's dead row versions
and the pending backlog; the health report is taken just before the snapshot ends
(the worst moment) and printed with the table. ``--plot`` writes the seconds as a PNG
(matplotlib, from the ``benchmarks`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from benchmarks import runner, stacks
from state_adapters.health import HealthReport, HealthThresholds
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer

NAME = "held-horizon"
HELP = "steady enqueue+drain while a REPEATABLE READ snapshot is held, then released"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of the run")
    parser.add_argument("--hold-at", type=float, default=15.0, help="second the hold begins")
    parser.add_argument("--hold-for", type=float, default=60.0, help="seconds it is held")
    parser.add_argument("--rate", type=int, default=200, help="jobs started per second")
    parser.add_argument("--limit", type=int, default=10, help="jobs per claim")
    parser.add_argument(
        "--horizon-age",
        type=float,
        default=10.0,
        help="seconds a held snapshot may be old before the health report names it",
    )
    parser.add_argument("--plot", default="", help="write the seconds as a PNG here")
    stacks.add_stack_arguments(parser)


@dataclass
class Second:
    at: float
    claimed: int = 0
    claims: list[float] = field(default_factory=list)
    dead: int | None = None
    pending: int | None = None


async def run(args: argparse.Namespace) -> str:
    async with stacks.open_stack("postgres", "noop", args) as stack:
        async with stack.engine.connect() as conn:
            autovacuum = (await conn.execute(text("SHOW autovacuum"))).scalar_one()
        seconds, worst = await _run(stack, args)
    rows = {
        phase: _phase(seconds, lo, hi)
        for phase, lo, hi in (
            ("before the hold", 0.0, args.hold_at),
            ("held", args.hold_at, args.hold_at + args.hold_for),
            ("after the release", args.hold_at + args.hold_for, args.duration),
        )
    }
    if args.plot:
        _plot(seconds, args)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"{f.severity:<8} {f.subject}: {f.summary}" for f in worst.problems()]
    return runner.report(
        f"Held horizon: {args.rate} jobs/s while a snapshot is held for {args.hold_for:g} s",
        [
            runner.table(rows, first_column="phase"),
            "The health report just before the release (problems only):\n\n```\n"
            + "\n".join(lines or ["(none)"])
            + "\n```",
        ],
        notes=[
            f"one producer ({args.rate} jobs/s in ten batches a second), one loop claiming up "
            f"to {args.limit} and completing them; per phase: jobs claimed per second "
            "(median of the seconds), p99 of the claims, the most dead row versions of the "
            "jobs table and the largest backlog seen; VACUUM of the jobs and chains tables "
            f"right after the release (the server's autovacuum: {autovacuum}); "
            f"measured {stamp}",
            runner.machine_notes(),
        ],
    )


async def _run(stack: stacks.Stack, args: argparse.Namespace) -> tuple[list[Second], HealthReport]:
    state = stack.state
    jobs_table = f"{stack.prefix}_jobs"
    seconds = [Second(float(n)) for n in range(int(args.duration) + 1)]
    begin = time.monotonic()
    stop = asyncio.Event()
    notes = NotificationBuffer()

    def now() -> Second:
        return seconds[min(int(time.monotonic() - begin), len(seconds) - 1)]

    async def produce() -> None:
        batch = max(1, args.rate // 10)
        tick = 0
        while not stop.is_set():
            await state.start_chains(
                [NewChain(NewJob("held-horizon", None)) for _ in range(batch)], notes=notes
            )
            tick += 1
            await asyncio.sleep(max(0.0, begin + tick / 10 - time.monotonic()))

    async def drain() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            jobs = await state.acquire(
                ["held-horizon"], worker_id="bench", lease_seconds=60, limit=args.limit
            )
            second = now()
            second.claims.append(time.perf_counter() - started)
            if not jobs:
                await asyncio.sleep(0.005)
                continue
            second.claimed += len(jobs)
            done = [Completion(j.id, j.lease_token or "", None) for j in jobs]
            await state.complete_jobs(done, notes=notes)

    async def sample() -> None:
        query = text(
            f"SELECT pg_stat_get_dead_tuples('{jobs_table}'::regclass), "
            f"(SELECT count(*) FROM {jobs_table} WHERE status = 'pending')"
        )
        while not stop.is_set():
            async with stack.engine.connect() as conn:
                dead, pending = (await conn.execute(query)).one()
            second = now()
            second.dead, second.pending = int(dead), int(pending)
            await asyncio.sleep(1.0)

    async def hold() -> HealthReport:
        await asyncio.sleep(args.hold_at)
        dsn = make_url(args.postgres_url).set(drivername="postgresql").render_as_string(False)
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name="analytics-report"
        )
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await conn.execute("SELECT 1")
            await asyncio.sleep(args.hold_for - 1.0)
            report = await stack.client.health(
                thresholds=HealthThresholds(horizon_age=args.horizon_age)
            )
            await asyncio.sleep(1.0)
            await conn.execute("ROLLBACK")
        finally:
            await conn.close()
        async with stack.engine.connect() as own:
            own = await own.execution_options(isolation_level="AUTOCOMMIT")
            for table in ("jobs", "chains"):
                await own.execute(text(f"VACUUM {stack.prefix}_{table}"))
        return report

    tasks = [asyncio.create_task(t()) for t in (produce, drain, sample)]
    holding = asyncio.create_task(hold())
    await asyncio.sleep(args.duration)
    stop.set()
    await asyncio.gather(*tasks)
    return seconds, await holding


def _phase(seconds: list[Second], lo: float, hi: float) -> runner.Figures:
    inside = [s for s in seconds if lo <= s.at < hi]
    claims = [c for s in inside for c in s.claims]
    claimed = sorted(s.claimed for s in inside)
    return {
        "jobs/s": float(claimed[len(claimed) // 2]) if claimed else 0.0,
        "claim p99 ms": runner.percentiles(claims)["p99 ms"],
        "dead rows, most": float(max((s.dead for s in inside if s.dead is not None), default=0)),
        "backlog, most": float(
            max((s.pending for s in inside if s.pending is not None), default=0)
        ),
    }


def _plot(seconds: list[Second], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.at for s in seconds]
    p99 = [runner.percentiles(s.claims)["p99 ms"] if s.claims else float("nan") for s in seconds]
    figure, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    series: list[tuple[Any, list[float], str]] = [
        (axes[0], [float(s.claimed) for s in seconds], "jobs claimed / s"),
        (axes[1], p99, "claim p99, ms"),
        (axes[2], [float("nan") if s.dead is None else s.dead for s in seconds], "dead rows"),
    ]
    for axis, values, label in series:
        known = [(x, v) for x, v in zip(xs, values, strict=True) if v == v]  # not NaN
        axis.plot([x for x, _ in known], [v for _, v in known], linewidth=1.2)
        axis.set_ylabel(label)
        axis.axvspan(args.hold_at, args.hold_at + args.hold_for, color="#f4c7c3", alpha=0.5)
        axis.grid(alpha=0.3)
    axes[2].set_xlabel("seconds (shaded: a REPEATABLE READ snapshot held open; VACUUM at its end)")
    axes[2].set_ylabel("dead rows (jobs table)")
    figure.suptitle(f"{args.rate} jobs/s enqueued and drained on Postgres", fontsize=11)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    plt.close(figure)
