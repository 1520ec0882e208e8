"""The worker application of ``python -m benchmarks churn``, run as worker processes:
``python -m queuert_notify.cli worker benchmarks.chaos_app:build_worker``.

Configured through the environment (``QT_*``): ``QT_DATABASE_URL``, ``QT_TABLE_PREFIX``,
``QT_NOTIFY`` (``redis``, ``redis-lists`` with ``QT_REDIS_URL``/``QT_REDIS_PREFIX``;
``in-process``; else none), ``QT_MODE`` (``atomic``, the default, or ``staged``),
``QT_CONCURRENCY``, ``QT_LEASE``, ``QT_POLL``, ``QT_SCHEDULE_EVERY`` and ``QT_RETENTION``
(seconds).

Its ``chaos`` handler sleeps ``input["sleep"]`` seconds and records one row per run in
``{prefix}effects``: job, chain, attempt, worker, the instant its claim took (its lease's
end minus the lease, read before any renewal) and the instants it started and ended. In
atomic mode the row goes through ``ctx.session``, so it commits exactly when the job's
completion does (two rows for a job = completed twice); in staged mode it commits in a
transaction of its own just before the completion (a run killed after it re-runs: at
least once). ``input["steps"] > 1`` continues the chain with one step fewer.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.maintenance.schedules import Schedule
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker

TYPE_NAME = "chaos"


def effects_table(table_prefix: str) -> Table:
    """One row per recorded run of a ``chaos`` job (committed with it in atomic mode)."""
    return Table(
        f"{table_prefix}effects",
        MetaData(),
        Column("job_id", String(64), nullable=False),
        Column("chain_id", String(64), nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("steps", Integer, nullable=False),
        Column("concurrency_key", String(255), nullable=True),
        Column("worker_id", String(64), nullable=False),
        Column("claimed", Float, nullable=False),
        Column("started", Float, nullable=False),
        Column("ended", Float, nullable=False),
    )


def _notify() -> NotifyAdapter:
    kind = os.environ.get("QT_NOTIFY", "none")
    if kind in ("redis", "redis-lists"):
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        return RedisNotifyAdapter(
            url=os.environ["QT_REDIS_URL"],
            prefix=os.environ["QT_REDIS_PREFIX"],
            wake="lists" if kind == "redis-lists" else "pubsub",
        )
    if kind == "in-process":
        from queuert_notify.notify.in_process import InProcessNotifyAdapter

        return InProcessNotifyAdapter()
    from queuert_notify.notify.noop import NoopNotifyAdapter

    return NoopNotifyAdapter()


def _seconds(name: str) -> timedelta | None:
    value = os.environ.get(name)
    return None if value is None else timedelta(seconds=float(value))


def _utc(instant: datetime) -> datetime:
    """The database's instants are UTC, with or without a zone attached."""
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


def build_worker() -> Worker:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    table_prefix = os.environ["QT_TABLE_PREFIX"]
    worker_id = os.environ.get("QT_WORKER_ID", f"proc-{os.getpid()}")
    concurrency = int(os.environ.get("QT_CONCURRENCY", "8"))
    lease = float(os.environ.get("QT_LEASE", "5"))
    mode = os.environ.get("QT_MODE", "atomic")
    # Atomic handlers hold a connection each, plus the claim loop and renewals.
    engine = create_async_engine(os.environ["QT_DATABASE_URL"], pool_size=concurrency + 4)
    effects = effects_table(table_prefix)
    state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
    jobs = state.tables.jobs

    async def chaos(job: Job, ctx: JobContext) -> Any:
        started = time.time()
        settings = job.input or {}
        async with engine.connect() as conn:
            leased_until = (
                await conn.execute(select(jobs.c.leased_until).where(jobs.c.id == job.id))
            ).scalar_one()
        # Sleep before writing: on SQLite a write holds the single write lock until the
        # completion commits, and a process killed mid-sleep must hold nothing.
        await asyncio.sleep(float(settings.get("sleep", 0)))
        steps = int(settings.get("steps", 1))
        row = insert(effects).values(
            job_id=job.id,
            chain_id=job.chain_id,
            attempt=job.attempt,
            steps=steps,
            concurrency_key=job.concurrency_key,
            worker_id=worker_id,
            claimed=_utc(leased_until).timestamp() - lease,
            started=started,
            ended=time.time(),
        )
        if mode == "atomic":
            await ctx.session.execute(row)
        else:
            async with engine.begin() as conn:
                await conn.execute(row)
        if steps > 1:
            return ctx.continue_with(TYPE_NAME, {**settings, "steps": steps - 1})
        return None

    every = _seconds("QT_SCHEDULE_EVERY")
    return Worker(
        Client(state=state, notify=_notify()),
        {TYPE_NAME: chaos},
        worker_id=worker_id,
        mode="staged" if mode == "staged" else "atomic",
        concurrency=concurrency,
        lease=lease,
        poll_interval=float(os.environ.get("QT_POLL", "0.5")),
        reap_interval=float(os.environ.get("QT_REAP", "0.5")),
        schedules=[] if every is None else [Schedule("chaos-every", TYPE_NAME, every=every)],
        retention=_seconds("QT_RETENTION"),
    )
