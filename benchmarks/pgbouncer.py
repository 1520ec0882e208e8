"""Issue #27: the queue behind PgBouncer in transaction pooling mode.

A PgBouncer of the benchmark's own (Debian's, on a free loopback port, in front of
``--postgres-url``) with ``default_pool_size = --pool-size``.

Wake latency: one idle worker (concurrency 1, poll interval 60 s, Redis Pub/Sub wakeups)
and a producer with a client of its own, both on one engine per variant: straight to
Postgres (the driver's defaults) or through PgBouncer (the driver's settings for it,
docs/databases.md). Latency runs from ``start_chain`` returning (committed, wakeup
published) to the handler's first line; random gaps between jobs, as in
``wake-latency``.

Many processes: ``--processes`` worker processes of ``--concurrency`` slots each
(``tests.support.e2e_app``: each job writes a row in its handler's transaction) and a
producer, all through the one PgBouncer. The workers start and finish a warm-up batch
first (every process ran a job of it); then ``--jobs`` jobs are started in batches of
100 and the clock runs until the last one completed. ``SHOW POOLS`` on PgBouncer's admin
console is read every 50 ms meanwhile: the most server connections it held.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from importlib import metadata
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks import runner, services
from benchmarks.wake_latency import WakeProbe
from queuert_notify.client import ChainSpec, Client
from queuert_notify.notify.redis import RedisNotifyAdapter
from queuert_notify.worker import Worker
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.pgbouncer import POOLER_SETTINGS, Bouncer, own_pgbouncer, worker_fleet
from tests.support.queue_helpers import drop_tables
from tests.support.redis_helpers import delete_prefix

NAME = "pgbouncer"
HELP = "wake latency and many worker processes through PgBouncer (transaction mode)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per variant")
    parser.add_argument("--samples", type=int, default=100, help="jobs per wake round")
    parser.add_argument("--min-gap", type=float, default=0.02)
    parser.add_argument("--max-gap", type=float, default=0.1)
    parser.add_argument("--drivers", default="psycopg,asyncpg")
    parser.add_argument("--pool-size", type=int, default=10, help="PgBouncer default_pool_size")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs of the many-process run")
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--postgres-url", default=services.postgres_url())


def _url(args: argparse.Namespace, bouncer: Bouncer | None, driver: str) -> str:
    if bouncer is not None:
        return bouncer.url(driver)
    rest = args.postgres_url.split("://", 1)[1]
    return f"postgresql+{driver}://{rest}"


def _wake_variant(args: argparse.Namespace, bouncer: Bouncer | None, driver: str) -> runner.Variant:
    settings = POOLER_SETTINGS[driver] if bouncer is not None else {}

    async def one_round() -> runner.Figures:
        prefix = f"bpgb{random.randrange(16**8):08x}"
        engine = create_async_engine(_url(args, bouncer, driver), connect_args=settings)
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await state.migrate()
        probe = WakeProbe()
        arrival, completion = probe.arrival, probe.completion
        handler, on_event = probe.handler, probe.on_event

        latencies = []
        try:
            async with (
                Client(state=state, notify=_redis(args, prefix)) as producer,
                Client(state=state, notify=_redis(args, prefix)) as consumer,
                Worker(
                    consumer,
                    {"bench": handler},
                    concurrency=1,
                    poll_interval=60.0,
                    on_event=on_event,
                ),
            ):
                await asyncio.sleep(0.2)  # past the worker's first poll: it is asleep
                for _ in range(args.samples):
                    await asyncio.sleep(random.uniform(args.min_gap, args.max_gap))
                    chain = await producer.start_chain("bench")
                    committed = time.perf_counter()
                    async with asyncio.timeout(30):
                        started = await arrival(chain.id)
                        await completion(chain.id)
                    latencies.append(max(0.0, started - committed))
        finally:
            await drop_tables(engine, f"{prefix}_")
            await engine.dispose()
            await delete_prefix(args.redis_url, prefix)
        return runner.percentiles(latencies)

    route = "PgBouncer" if bouncer is not None else "direct"
    return runner.Variant(f"{driver}, {route}", one_round)


def _redis(args: argparse.Namespace, prefix: str) -> RedisNotifyAdapter:
    return RedisNotifyAdapter(args.redis_url, prefix=prefix)


async def _many_processes(
    args: argparse.Namespace, bouncer: Bouncer, driver: str, direct: AsyncEngine
) -> runner.Figures:
    prefix = f"bpgb{random.randrange(16**8):08x}"

    async def completed(client: Client) -> int:
        return (await client.count_jobs()).get("completed", 0)

    async def wait_for(client: Client, total: int) -> None:
        while await completed(client) < total:  # noqa: ASYNC110 (the count is in SQL)
            await asyncio.sleep(0.05)

    async with worker_fleet(
        bouncer,
        driver,
        direct,
        redis_url=args.redis_url,
        prefix=prefix,
        processes=args.processes,
        concurrency=args.concurrency,
        log_dir=Path(tempfile.mkdtemp(prefix="bench-pgbouncer-")),
    ) as fleet:
        effects = fleet.effects
        async with Client(state=fleet.state, notify=_redis(args, prefix)) as producer:
            # Warm-up: until every process ran a job, so the clock starts on a warm fleet.
            warmed = 0
            while True:
                await producer.start_chains([ChainSpec("effect")] * 100)
                warmed += 100
                await wait_for(producer, warmed)
                async with direct.connect() as conn:
                    ran = await conn.scalar(select(func.count(effects.c.worker_id.distinct())))
                if ran == args.processes:
                    break
            began = time.perf_counter()
            for _ in range(0, args.jobs, 100):
                await producer.start_chains([ChainSpec("effect")] * 100)
            total = warmed + (args.jobs + 99) // 100 * 100
            await wait_for(producer, total)
            elapsed = time.perf_counter() - began
        async with direct.connect() as conn:
            rows, distinct = (
                await conn.execute(select(func.count(), func.count(effects.c.job_id.distinct())))
            ).one()
        if rows != distinct or rows != total:
            raise RuntimeError(f"{rows} effects of {distinct} jobs, {total} started")
    return {
        "jobs/s": (total - warmed) / elapsed,
        "server connections (max)": float(fleet.most),
    }


async def run(args: argparse.Namespace) -> str:
    drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    with own_pgbouncer(args.postgres_url, pool_size=args.pool_size) as bouncer:
        variants = [
            _wake_variant(args, route, driver) for driver in drivers for route in (None, bouncer)
        ]
        wake_rows = await runner.medians(variants, args.rounds, warmup=0)
        direct = create_async_engine(args.postgres_url)
        try:
            scale_rows = {
                f"{driver}, {args.processes} processes x {args.concurrency} slots": (
                    await _many_processes(args, bouncer, driver, direct)
                )
                for driver in drivers
            }
        finally:
            await direct.dispose()
    return runner.report(
        "Behind PgBouncer (transaction mode)",
        [
            f"Wake latency of an idle worker (poll interval 60 s, Redis Pub/Sub), commit to "
            f"handler start, ms; medians over {args.rounds} alternating rounds of "
            f"{args.samples} jobs:",
            runner.table(wake_rows, first_column="driver, route"),
            f"{args.processes} worker processes x {args.concurrency} slots and a producer "
            f"through one PgBouncer (default_pool_size = {args.pool_size}); {args.jobs} jobs "
            "in batches of 100, each writing a row in its handler's transaction:",
            runner.table(scale_rows, first_column="driver, fleet"),
        ],
        notes=[
            f"asyncpg {metadata.version('asyncpg')}, PgBouncer 1.18 (Debian), Postgres "
            f"{await services.postgres_server_version(args.postgres_url)}, Redis "
            f"{await services.redis_server_version(args.redis_url)} on the same host",
            runner.machine_notes(),
        ],
    )
