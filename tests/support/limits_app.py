"""A user application for the limits and pause tests, run as worker processes:
``python -m queuert_notify.cli worker tests.support.limits_app:build_worker``.

Configured as :mod:`tests.support.e2e_app` (``QT_*``). Its ``limited`` handler
sleeps ``input["sleep"]`` seconds and records one row per run in
``{prefix}runs`` -- its job, concurrency key, worker, the instant its claim took
(its lease's end minus the lease) and the wall-clock instants it started and
ended -- through ``ctx.session``, so the row commits with the job's
completion. A handler's run lies inside the time its job is ``running`` in the
database, so overlaps of these rows never exceed what the database allowed.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sqlalchemy import Column, Float, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.e2e_app import _notify

LEASE = 60.0
"""Seconds; no run renews its lease, so the lease's end tells when the claim took."""


def runs_table(table_prefix: str) -> Table:
    """One row per completed run of a ``limited`` job."""
    return Table(
        f"{table_prefix}runs",
        MetaData(),
        Column("job_id", String(64), nullable=False),
        Column("concurrency_key", String(255), nullable=True),
        Column("worker_id", String(64), nullable=False),
        Column("claimed", Float, nullable=False),
        Column("started", Float, nullable=False),
        Column("ended", Float, nullable=False),
    )


def build_worker() -> Worker:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    table_prefix = os.environ["QT_TABLE_PREFIX"]
    worker_id = os.environ.get("QT_WORKER_ID", f"proc-{os.getpid()}")
    concurrency = int(os.environ.get("QT_CONCURRENCY", "8"))
    engine = create_async_engine(os.environ["QT_DATABASE_URL"], pool_size=concurrency + 4)
    runs = runs_table(table_prefix)
    state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
    client = Client(state=state, notify=_notify())
    jobs = state.tables.jobs

    async def limited(job: Job, ctx: JobContext) -> None:
        started = time.time()
        lease = select(jobs.c.leased_until).where(jobs.c.id == job.id)
        leased_until = (await ctx.session.execute(lease)).scalar_one()
        await asyncio.sleep(float((job.input or {}).get("sleep", 0)))
        row: dict[str, Any] = {
            "job_id": job.id,
            "concurrency_key": job.concurrency_key,
            "worker_id": worker_id,
            "claimed": leased_until.timestamp() - LEASE,
            "started": started,
            "ended": time.time(),
        }
        await ctx.session.execute(insert(runs).values(**row))

    return Worker(
        client,
        {"limited": limited},
        worker_id=worker_id,
        concurrency=concurrency,
        poll_interval=float(os.environ.get("QT_POLL", "60")),
        lease=LEASE,
    )
