"""``queuert-notify demo``: the whole product in one process, measured.

Enqueues a few thousand three-step chains (fetch -> transform -> store, a few of them
flaky so retries show), one chain blocked on a hundred others, and one chain whose
handler always fails; runs several workers until every chain is final; then measures
wake latency -- commit of a transactional enqueue to handler start -- on idle workers.
Runs on a fresh SQLite file with the in-process notify adapter unless told otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Handler, Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker, WorkerMode
from state_adapters.model import ContinueWith

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ENQUEUE_BATCH = 250
BLOCKED_ON = 100
FLAKY_EVERY = 50
PROBES = 100


class DemoFlake(Exception):
    """Raised on purpose by the demo's flaky handlers."""


@dataclass
class DemoReport:
    """What the demo measured."""

    database: str
    notify: str
    workers: int
    concurrency: int
    mode: str
    chains: int = 0
    jobs: int = 0
    seconds: float = 0.0
    retries: int = 0
    failures: int = 0
    ownership_lost: int = 0
    wake_latencies_ms: list[float] = field(default_factory=list)
    final_statuses: dict[str, int] = field(default_factory=dict)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    def latency_percentile(self, p: float) -> float | None:
        """The p-th percentile (0-100) of wake latency in ms, nearest-rank."""
        if not self.wake_latencies_ms:
            return None
        ordered = sorted(self.wake_latencies_ms)
        rank = max(1, round(p / 100 * len(ordered)))
        return ordered[min(rank, len(ordered)) - 1]


class _Tally:
    """Counts worker events (called on the event loop, so plain ints are safe)."""

    def __init__(self, on_chain_done: Callable[[], None]) -> None:
        self.jobs = 0
        self.chains_done = 0
        self.retries = 0
        self.failures = 0
        self.ownership_lost = 0
        self._on_chain_done = on_chain_done
        self.all_done = asyncio.Event()
        self.expected_chains: int | None = None

    def __call__(self, event: WorkerEvent) -> None:
        if event.type_name == "ping":
            return  # latency probes are measured apart
        if event.kind == "completed":
            self.jobs += 1
            if event.continued_with is None:
                self._chain_done()
        elif event.kind == "failed":
            self.jobs += 1
            self.failures += 1
            self._chain_done()
        elif event.kind == "retried":
            self.retries += 1
        elif event.kind == "ownership_lost":
            self.ownership_lost += 1

    def _chain_done(self) -> None:
        self.chains_done += 1
        self._on_chain_done()
        if self.expected_chains is not None and self.chains_done >= self.expected_chains:
            self.all_done.set()


class _DropDemoFlakes(logging.Filter):
    """Keeps the demo's deliberate failures out of the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], DemoFlake))


def _handlers(probe_starts: dict[str, float]) -> dict[str, Handler]:
    async def fetch(job: Job, ctx: JobContext) -> ContinueWith:
        return ctx.continue_with("transform", {"n": job.input["n"], "fetched": True})

    async def transform(job: Job, ctx: JobContext) -> ContinueWith:
        if job.input["n"] % FLAKY_EVERY == 0 and job.attempt == 1:
            raise DemoFlake("a flaky dependency failed once; the retry will succeed")
        return ctx.continue_with("store", {"n": job.input["n"], "value": job.input["n"] * 2})

    async def store(job: Job, ctx: JobContext) -> dict[str, Any]:
        return {"stored": job.input["value"]}

    async def report(job: Job, ctx: JobContext) -> dict[str, Any]:
        return {"summarized": job.input["chains"]}

    async def always_fails(job: Job, ctx: JobContext) -> None:
        raise DemoFlake("this handler always fails, so the chain ends as failed")

    async def ping(job: Job, ctx: JobContext) -> None:
        probe_starts[job.chain_id] = time.perf_counter()

    return {
        "fetch": fetch,
        "transform": transform,
        "store": store,
        "report": report,
        "always-fails": always_fails,
        "ping": ping,
    }


def engine_options(workers: int) -> dict[str, Any]:
    """``create_async_engine`` options for a demo database run by ``workers`` workers.

    Each worker uses about two connections at once (claims, completion batches); a pool
    smaller than that opens and closes a connection per transaction.
    """
    return {"pool_size": 2 * workers + 4}


async def run_demo(
    *,
    engine: AsyncEngine | None,
    redis_url: str | None,
    chains: int,
    workers: int,
    concurrency: int,
    mode: WorkerMode = "atomic",
    progress: Callable[[int, int], None] | None = None,
) -> DemoReport:
    """Run the demo and return its measurements. With no ``engine`` a SQLite file in a
    temporary directory is used and removed; with one (the caller's, made with
    :func:`engine_options`, disposed by the caller), tables get a unique prefix and are
    dropped afterwards. ``progress(done, total)`` reports finished chains."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    own_engine = engine is None
    tmpdir = Path(tempfile.mkdtemp(prefix="queuert-demo-")) if own_engine else None
    if engine is None:
        engine = create_async_engine(
            f"sqlite+aiosqlite:///{tmpdir}/demo.db", **engine_options(workers)
        )
    table_prefix = f"demo_{uuid.uuid4().hex[:8]}_"
    flake_filter = _DropDemoFlakes()
    worker_logger = logging.getLogger("queuert_notify.worker.job_outcome")
    worker_logger.addFilter(flake_filter)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        await state.migrate()
        notify = _notify_adapter(redis_url, table_prefix)
        report = DemoReport(
            database=(
                engine.url.render_as_string(hide_password=True)
                if not own_engine
                else "SQLite (fresh temporary file)"
            ),
            notify=type(notify).__name__,
            workers=workers,
            concurrency=concurrency,
            mode=mode,
        )
        async with Client(state=state, notify=notify) as client:
            await _run(client, engine, report, chains, workers, concurrency, mode, progress)
        return report
    finally:
        worker_logger.removeFilter(flake_filter)
        if own_engine:
            await engine.dispose()
        else:
            await _drop_tables(engine, table_prefix)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _notify_adapter(redis_url: str | None, prefix: str) -> NotifyAdapter:
    if redis_url:
        from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

        return RedisNotifyAdapter(url=redis_url, prefix=prefix.rstrip("_"))
    from queuert_notify.notify.in_process import InProcessNotifyAdapter

    return InProcessNotifyAdapter()


async def _run(
    client: Client,
    engine: Any,
    report: DemoReport,
    chains: int,
    workers: int,
    concurrency: int,
    mode: WorkerMode,
    progress: Callable[[int, int], None] | None,
) -> None:
    total = chains + 2  # + the blocked report + the always-failing chain
    tally = _Tally(lambda: progress(tally.chains_done, total) if progress else None)
    tally.expected_chains = total
    probe_starts: dict[str, float] = {}
    handlers = _handlers(probe_starts)
    pool = [
        Worker(
            client,
            handlers,
            concurrency=concurrency,
            mode=mode,
            worker_id=f"demo-{i + 1}",
            on_event=tally,
            retry_backoff=lambda attempt: 0.05 * attempt,
        )
        for i in range(workers)
    ]
    for worker in pool:
        await worker.__aenter__()
    try:
        started = time.perf_counter()
        await _enqueue(client, chains)
        await tally.all_done.wait()
        report.seconds = time.perf_counter() - started
        report.chains = tally.chains_done
        report.jobs = tally.jobs
        report.retries = tally.retries
        report.failures = tally.failures
        report.ownership_lost = tally.ownership_lost
        report.wake_latencies_ms = await _probe_wake_latency(client, engine, probe_starts)
        counts = await client.count_jobs()
        report.final_statuses = {k: v for k, v in counts.items() if v}
    finally:
        await asyncio.gather(*(worker.stop() for worker in pool))


async def _enqueue(client: Client, chains: int) -> None:
    first_ids: list[str] = []
    for start in range(0, chains, ENQUEUE_BATCH):
        specs = [
            ChainSpec("fetch", {"n": n}) for n in range(start, min(start + ENQUEUE_BATCH, chains))
        ]
        started = await client.start_chains(specs)
        if len(first_ids) < BLOCKED_ON:
            first_ids.extend(chain.id for chain in started[: BLOCKED_ON - len(first_ids)])
        if start == 0:
            await client.start_chain("report", {"chains": len(first_ids)}, blockers=first_ids)
            await client.start_chain("always-fails", None, max_attempts=3)


async def _probe_wake_latency(
    client: Client, engine: Any, probe_starts: dict[str, float]
) -> list[float]:
    """Enqueue one chain at a time inside our own transaction with every worker idle;
    latency is handler start minus the moment COMMIT returned."""
    from sqlalchemy.ext.asyncio import AsyncSession

    latencies = []
    for i in range(PROBES):
        async with AsyncSession(engine) as session:
            async with session.begin():
                chain = await client.start_chain("ping", {"probe": i}, session=session)
            committed = time.perf_counter()
        await client.await_chain(chain.id, timeout=30, poll_interval=1.0)
        latencies.append(max(0.0, (probe_starts[chain.id] - committed) * 1000))
    return latencies


async def _drop_tables(engine: Any, table_prefix: str) -> None:
    """Drop the tables this demo run created (all share its unique prefix)."""
    from sqlalchemy import MetaData

    def drop(sync_conn: Any) -> None:
        metadata = MetaData()
        metadata.reflect(sync_conn, only=lambda name, _: name.startswith(table_prefix))
        metadata.drop_all(sync_conn)

    async with engine.begin() as conn:
        await conn.run_sync(drop)


def latency_summary(report: DemoReport) -> str:
    """``p50 / p90 / p99`` in ms, or ``n/a``."""
    values = [report.latency_percentile(p) for p in (50, 90, 99)]
    if any(v is None for v in values):
        return "n/a"
    return " / ".join(f"{v:.1f}" for v in values if v is not None)
