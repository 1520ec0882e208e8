"""procrastinate's side of ``python -m benchmarks peers`` (runs in the peers' virtualenv).

Configuration, as procrastinate's quickstart sets it up: ``PsycopgConnector``
(psycopg 3 with its connection pool), the schema of ``apply_schema_async``,
``Task.defer_async`` (one ``procrastinate_defer_jobs_v1`` call on an
autocommit connection: its own transaction), a worker with its defaults
(``listen_notify=True``: woken by the NOTIFY its defer trigger sends); drains
use ``wait=False``, which returns once the queue is caught up, every job's
status written.

Two configurations (``--config``): ``defaults``, the worker's default
``concurrency=1``; ``matched``, ``concurrency=N``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable

import procrastinate
import workloads

_FILL_BATCH = 1000


class ProcrastinateSide:
    def __init__(self, dsn: str, config: str) -> None:
        self.config = config
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        self.arrival: workloads.Arrival = lambda: None

        @self.app.task(name="noop")
        async def noop() -> None:
            self.arrival()

        self.task = noop

    async def setup(self) -> None:
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def enqueue(self) -> None:
        await self.task.defer_async()

    async def enqueue_batch(self, jobs: int) -> None:
        await self.task.batch_defer_async(*({} for _ in range(jobs)))

    async def fill(self, jobs: int) -> None:
        for offset in range(0, jobs, _FILL_BATCH):
            await self.enqueue_batch(min(_FILL_BATCH, jobs - offset))
        await self.app.connector.execute_query_async("ANALYZE")

    async def drain(self, jobs: int, concurrency: int) -> float:
        started = asyncio.get_running_loop().time()
        await self.app.run_worker_async(
            **self._concurrency(concurrency), wait=False, install_signal_handlers=False
        )
        seconds = asyncio.get_running_loop().time() - started
        async with self.app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
            cursor = await conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
            )
            row = await cursor.fetchone()
        if row[0]:
            raise RuntimeError(f"procrastinate drain returned with {row[0]} jobs left")
        return seconds

    def _concurrency(self, concurrency: int) -> dict[str, int]:
        return {} if self.config == "defaults" else {"concurrency": concurrency}

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        self.arrival = arrival
        task = asyncio.create_task(
            self.app.run_worker_async(**self._concurrency(1), install_signal_handlers=False)
        )

        async def stop() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        return stop


def _side(args: argparse.Namespace) -> ProcrastinateSide:
    return ProcrastinateSide(args.dsn, args.config)


if __name__ == "__main__":
    # A line per job at INFO would time the terminal, not the queue.
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    workloads.main(_side, __doc__ or "")
