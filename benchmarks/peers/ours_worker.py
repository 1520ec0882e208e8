"""The worker of ``ours_side.py --processes N``: ``queuert-notify worker
benchmarks.peers.ours_worker:build_worker --processes N`` builds one per process,
configured by ``ours_side.py`` through the environment (``QUEUERT_BENCH_*``)."""

from __future__ import annotations

import os

from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _notify() -> NotifyAdapter:
    redis_url = os.environ.get("QUEUERT_BENCH_REDIS_URL")
    if redis_url:
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        return RedisNotifyAdapter(url=redis_url, prefix=os.environ["QUEUERT_BENCH_PREFIX"])
    from queuert_notify.notify.noop import NoopNotifyAdapter

    return NoopNotifyAdapter()


def build_worker() -> Worker:
    """A no-op worker on the benchmark's tables."""
    concurrency = int(os.environ["QUEUERT_BENCH_CONCURRENCY"])
    engine = create_async_engine(
        os.environ["QUEUERT_BENCH_DATABASE_URL"], pool_size=concurrency + 4, max_overflow=0
    )
    state = SqlAlchemyStateAdapter(engine, table_prefix=os.environ["QUEUERT_BENCH_TABLE_PREFIX"])
    return Worker(
        Client(state=state, notify=_notify()), {"bench-noop": _noop}, concurrency=concurrency
    )
