"""A user application for tests that run workers in their own processes:
``python -m queuert_notify.cli worker tests.support.e2e_app:build_worker``.

Configured through the environment (``QT_*``; wakeups from Redis with
``QT_REDIS_URL``/``QT_REDIS_PREFIX`` (``QT_REDIS_WAKE=lists``: list tokens;
``QT_REDIS_CLUSTER=1``: the URL is a Redis Cluster node's), from Postgres
with ``QT_POSTGRES_NOTIFY=prefix``).
Its ``effect`` handler records one row per run in an application table through
``ctx.session`` (atomic mode, the default), so
the row commits exactly when the job's completion does: counting rows per job proves
exactly-once completion across processes. With ``QT_MODE=staged`` the row commits in a
transaction of its own just before the completion (at least once).

``QT_CONNECT_ARGS`` (JSON) goes to the engine's ``connect_args`` (behind PgBouncer).
``QT_SCHEDULE_EVERY`` (seconds) gives the worker a schedule ``e2e-every`` that starts an
``effect`` chain every that many seconds; ``QT_RETENTION`` (seconds) prunes finished chains.

Job input: ``first_attempt_sleep`` (seconds, attempt 1 only), then ``gate`` (a file
path: waits until the file exists), then ``sleep`` (seconds, every attempt) before the
row is written.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Column, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.maintenance.schedules import Schedule
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker


def effects_table(table_prefix: str) -> Table:
    """One row per committed run of an ``effect`` job."""
    return Table(
        f"{table_prefix}effects",
        MetaData(),
        Column("job_id", String(64), nullable=False),
        Column("worker_id", String(64), nullable=False),
    )


def _notify() -> NotifyAdapter:
    if os.environ.get("QT_POSTGRES_NOTIFY"):
        from queuert_notify.notify.postgres import PostgresNotifyAdapter

        return PostgresNotifyAdapter(
            os.environ["QT_DATABASE_URL"], prefix=os.environ["QT_POSTGRES_NOTIFY"]
        )
    redis_url = os.environ.get("QT_REDIS_URL")
    if redis_url:
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        adapter: NotifyAdapter = RedisNotifyAdapter(
            url=redis_url,
            prefix=os.environ["QT_REDIS_PREFIX"],
            wake="lists" if os.environ.get("QT_REDIS_WAKE") == "lists" else "pubsub",
            cluster=os.environ.get("QT_REDIS_CLUSTER") == "1",
            consumer_timeout=float(os.environ.get("QT_CONSUMER_TIMEOUT", "10")),
        )
        return adapter
    from queuert_notify.notify.noop import NoopNotifyAdapter

    return NoopNotifyAdapter()


def build_worker() -> Worker:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    table_prefix = os.environ["QT_TABLE_PREFIX"]
    worker_id = os.environ.get("QT_WORKER_ID", f"proc-{os.getpid()}")
    concurrency = int(os.environ.get("QT_CONCURRENCY", "8"))
    # Atomic handlers hold a connection each, plus the claim loop and renewals.
    engine = create_async_engine(
        os.environ["QT_DATABASE_URL"],
        pool_size=concurrency + 4,
        connect_args=json.loads(os.environ.get("QT_CONNECT_ARGS", "{}")),
    )
    effects = effects_table(table_prefix)
    client = Client(
        state=SqlAlchemyStateAdapter(engine, table_prefix=table_prefix), notify=_notify()
    )

    mode = os.environ.get("QT_MODE", "atomic")

    async def effect(job: Job, ctx: JobContext) -> dict[str, Any]:
        # Sleep before writing: on SQLite a write holds the single write lock until the
        # completion commits, and a process killed mid-sleep must hold nothing.
        settings = job.input or {}
        if job.attempt == 1:
            await asyncio.sleep(float(settings.get("first_attempt_sleep", 0)))
        if "gate" in settings:
            gate = Path(settings["gate"])
            while True:  # the test opens it: a file, the one event that crosses processes
                if await asyncio.to_thread(gate.exists):
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(float(settings.get("sleep", 0)))
        row = insert(effects).values(job_id=job.id, worker_id=worker_id)
        if mode == "atomic":
            await ctx.session.execute(row)
        else:
            async with engine.begin() as conn:
                await conn.execute(row)
        return {"worker": worker_id}

    return Worker(
        client,
        {"effect": effect},
        worker_id=worker_id,
        mode="staged" if mode == "staged" else "atomic",
        concurrency=concurrency,
        lease=float(os.environ.get("QT_LEASE", "60")),
        poll_interval=float(os.environ.get("QT_POLL", "60")),
        reap_interval=float(os.environ.get("QT_REAP", "1")),
        schedules=_schedules(),
        retention=_seconds("QT_RETENTION"),
    )


def _seconds(name: str) -> timedelta | None:
    value = os.environ.get(name)
    return None if value is None else timedelta(seconds=float(value))


def _schedules() -> list[Schedule]:
    every = _seconds("QT_SCHEDULE_EVERY")
    return [] if every is None else [Schedule("e2e-every", "effect", every=every)]


def crash_at_start() -> Worker:
    """A worker target whose process exits with ``QT_EXIT_CODE`` (7) while building it:
    a worker process that crashes at every start."""
    raise SystemExit(int(os.environ.get("QT_EXIT_CODE", "7")))
