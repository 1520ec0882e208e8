"""Issue #16 item 5: the dashboard's pages with a million finished jobs kept.

Seeds ``--finished`` finished chains of one job each (spread evenly over the last
``--finished-over-hours``; 2 % failed, 1 % cancelled, every tenth with a
deduplication key, five types) and ``--pending`` pending chains started in the last
seconds, straight into the queue's tables with one ``INSERT ... SELECT`` per table.
Then requests each page through the ASGI app in-process (routing, the state
adapter's reads and the template rendering; no network) and reports per page the
p50 and p90 of ``--requests`` requests per round, medians over rounds.

Postgres gets ``VACUUM ANALYZE`` after the load (what autovacuum does soon after a
bulk insert); SQLite gets no ``ANALYZE`` (nothing runs it by itself there).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks import runner, services, stacks
from queuert_notify import ChainSpec, Client, InProcessNotifyAdapter, Worker
from queuert_notify.dashboard import create_app
from queuert_notify.jobs import Job, JobContext
from state_adapters import SqlAlchemyStateAdapter

NAME = "dashboard"
HELP = "dashboard page times with a million finished jobs and 10,000 pending"

PAGES = {
    "overview": "/",
    "chains, first page": "/chains",
    "chains, status=failed": "/chains?status=failed",
    "chains, status=pending": "/chains?status=pending",
    "chains, status=completed": "/chains?status=completed",
    "chains, type=type-3": "/chains?type=type-3",
    "chains, search by dedup key": "/chains?q=order-{dedup}",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds")
    parser.add_argument("--requests", type=int, default=20, help="requests per page and round")
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished chains")
    parser.add_argument("--pending", type=int, default=10_000, help="pending chains")
    parser.add_argument(
        "--finished-over-hours",
        type=float,
        default=168.0,
        help="hours the finished chains are spread over, ending now (1: all in the "
        "overview's window)",
    )
    parser.add_argument("--state", default="postgres,sqlite", help="postgres, sqlite or both")
    parser.add_argument(
        "--write-cost-jobs",
        type=int,
        default=0,
        help="instead of the pages: start and drain this many no-op jobs with and without "
        "the dashboard's three indexes, alternating (0: measure the pages)",
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())


def _seed_sql(dialect: str, p: str, finished: int, pending: int, hours: float) -> list[str]:
    """The statements that fill the tables: chains, then their one job each."""
    total = finished + pending
    now = time.time()
    step = hours * 3600 / max(finished, 1)
    if dialect == "postgresql":
        series = f"generate_series(1, {total}) AS s(n)"
        hex_id = "lpad(to_hex(n), 32, '0')"

        def at(seconds: str) -> str:
            return f"to_timestamp({seconds})"

        json_n = "jsonb_build_object('n', n)"
        ok = "'{\"ok\": true}'::jsonb"
        prefix_with = ""
    else:
        series = "seq"
        hex_id = "printf('%032x', n)"

        def at(seconds: str) -> str:
            return f"strftime('%Y-%m-%d %H:%M:%f', {seconds}, 'unixepoch') || '000'"

        json_n = "json_object('n', n)"
        ok = "'{\"ok\": true}'"
        prefix_with = (
            f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq "
            f"WHERE n < {total}) "
        )
    created = (
        f"CASE WHEN n <= {finished} THEN {now - hours * 3600} + n * {step} - 1 "
        f"ELSE {now} - ({total} - n) * 0.001 END"
    )
    status = (
        f"CASE WHEN n > {finished} THEN 'pending' WHEN n % 50 = 0 THEN 'failed' "
        "WHEN n % 100 = 1 THEN 'cancelled' ELSE 'completed' END"
    )
    done_at = f"CASE WHEN n <= {finished} THEN {at(f'({created}) + 1')} END"
    dedup = "CASE WHEN n % 10 = 0 THEN 'order-' || n END"
    chains = (
        f"INSERT INTO {p}chains (id, type_name, created_at, completed_at, has_dependents, "
        f"dedup_key) {prefix_with}SELECT {hex_id}, 'type-' || (n % 5), {at(created)}, "
        f"{done_at}, false, {dedup} FROM {series}"
    )
    jobs = (
        f"INSERT INTO {p}jobs (id, chain_id, chain_index, type_name, input, output, "
        "progress, status, priority, created_at, scheduled_at, completed_at, attempt, "
        "max_attempts, last_error, leased_by, lease_token, leased_until, "
        f"deduplication_key, blockers_pending) {prefix_with}SELECT {hex_id}, {hex_id}, 0, "
        f"'type-' || (n % 5), {json_n}, CASE WHEN n <= {finished} THEN {ok} END, NULL, "
        f"{status}, 0, {at(created)}, {at(created)}, {done_at}, "
        f"CASE WHEN n <= {finished} THEN 1 ELSE 0 END, 20, "
        f"CASE WHEN n <= {finished} AND n % 50 = 0 THEN 'RuntimeError: boom' END, "
        f"NULL, NULL, NULL, {dedup}, 0 FROM {series}"
    )
    return [chains, jobs]


async def _seed(engine: AsyncEngine, p: str, args: argparse.Namespace) -> float:
    began = time.perf_counter()
    async with engine.begin() as conn:
        for statement in _seed_sql(
            engine.dialect.name, p, args.finished, args.pending, args.finished_over_hours
        ):
            await conn.execute(text(statement))
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for table in ("chains", "jobs"):
                await conn.execute(text(f"VACUUM ANALYZE {p}{table}"))
    return time.perf_counter() - began


async def _measure(
    state_kind: str, args: argparse.Namespace, folder: Path
) -> dict[str, dict[str, float]]:
    if state_kind == "postgres":
        url = args.postgres_url
    else:
        url = f"sqlite+aiosqlite:///{folder}/dashboard.db"
    engine = create_async_engine(url)
    prefix = services.unique_prefix() + "_"
    state = SqlAlchemyStateAdapter(engine, table_prefix=prefix)
    await state.migrate()
    try:
        seconds = await _seed(engine, prefix, args)
        print(f"{state_kind}: seeded in {seconds:.0f} s", flush=True)
        app = create_app(state)
        transport = httpx.ASGITransport(app=app)
        dedup = max(10, (args.finished // 20) * 10)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:

            def page(path: str) -> runner.Variant:
                async def one_round() -> runner.Figures:
                    samples = []
                    for _ in range(args.requests):
                        began = time.perf_counter()
                        response = await http.get(path)
                        samples.append(time.perf_counter() - began)
                        assert response.status_code == 200, (path, response.text[:300])
                    figures = runner.percentiles(samples)
                    return {"p50 ms": figures["p50 ms"], "p90 ms": figures["p90 ms"]}

                return runner.Variant(path, one_round)

            variants = {name: page(path.format(dedup=dedup)) for name, path in PAGES.items()}
            results = await runner.alternate(list(variants.values()), args.rounds)
        return {name: results.medians(v.name) for name, v in variants.items()}
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(stacks.drop_prefixed, prefix)
        await engine.dispose()


INSPECTION_INDEXES = ("chains_dedup_ix", "jobs_status_chain_ix", "jobs_finished_ix")
"""The indexes migration 0002 adds for the dashboard's reads."""


def _write_cost_variant(
    state_kind: str, args: argparse.Namespace, folder: Path, *, indexes: bool
) -> runner.Variant:
    async def one_round() -> runner.Figures:
        if state_kind == "postgres":
            url = args.postgres_url
        else:
            url = f"sqlite+aiosqlite:///{folder}/{services.unique_prefix()}.db"
        engine = create_async_engine(url, pool_size=16)
        prefix = services.unique_prefix() + "_"
        state = SqlAlchemyStateAdapter(engine, table_prefix=prefix)
        await state.migrate()
        try:
            if not indexes:
                wanted = {prefix + name for name in INSPECTION_INDEXES}
                async with engine.begin() as conn:
                    for table in (state.tables.chains, state.tables.jobs):
                        for index in table.indexes:
                            if index.name in wanted:
                                await conn.run_sync(index.drop)
            jobs = args.write_cost_jobs
            async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
                began = time.perf_counter()
                for offset in range(0, jobs, 1000):
                    count = min(1000, jobs - offset)
                    await client.start_chains([ChainSpec("noop") for _ in range(count)])
                started = time.perf_counter()
                completions = stacks.Completions(jobs)

                drain_began = time.perf_counter()
                async with Worker(client, {"noop": _noop}, concurrency=10, on_event=completions):
                    async with asyncio.timeout(max(120.0, jobs / 50)):
                        await completions.done.wait()
                drained = time.perf_counter()
            return {
                "start jobs/s (1,000 per tx)": jobs / (started - began),
                "drain jobs/s": jobs / (drained - drain_began),
            }
        finally:
            async with engine.begin() as conn:
                await conn.run_sync(stacks.drop_prefixed, prefix)
            await engine.dispose()

    label = {"postgres": "Postgres", "sqlite": "SQLite"}[state_kind]
    return runner.Variant(
        f"{label}, {'with' if indexes else 'without'} the dashboard's indexes", one_round
    )


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


async def _write_cost(args: argparse.Namespace) -> str:
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for state_kind in args.state.split(","):
            pair = [
                _write_cost_variant(state_kind, args, Path(folder), indexes=True),
                _write_cost_variant(state_kind, args, Path(folder), indexes=False),
            ]
            results = await runner.alternate(pair, args.rounds)
            for variant in pair:
                rows[variant.name] = results.medians(variant.name)
            rows[f"{pair[0].name.split(',')[0]}: with / without"] = results.ratio(
                pair[0].name, pair[1].name
            )
    return runner.report(
        f"What the dashboard's indexes cost the write path, {args.write_cost_jobs:,} jobs",
        [runner.table(rows)],
        notes=[
            "one worker, concurrency 10, no-op handlers, in-process notify; "
            f"{args.rounds} alternating rounds (after one warm-up round), medians",
            runner.machine_notes(),
        ],
    )


async def run(args: argparse.Namespace) -> str:
    if args.write_cost_jobs:
        return await _write_cost(args)
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for state_kind in args.state.split(","):
            label = {"postgres": "Postgres", "sqlite": "SQLite"}[state_kind]
            for name, figures in (await _measure(state_kind, args, Path(folder))).items():
                rows[f"{label}, {name}"] = figures
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return runner.report(
        f"Dashboard pages, {args.finished:,} finished + {args.pending:,} pending jobs",
        [runner.table(rows, first_column="page")],
        notes=[
            f"finished jobs spread over the last {args.finished_over_hours:g} h; "
            f"{args.requests} requests per page and round, {args.rounds} rounds, medians; "
            f"measured {stamp}",
            "in-process ASGI requests (httpx.ASGITransport): routing, the state adapter's "
            "reads and the template rendering, no network",
            runner.machine_notes(),
        ],
    )
