"""chancy's side of ``python -m benchmarks peers`` (runs in the peers' virtualenv).

Configuration: chancy's defaults (``Chancy(dsn)``: its psycopg pool,
``notifications=True``, so a push wakes the worker's queue through
LISTEN/NOTIFY; the default plugins; a queue polling every 5 s) except two
queue options chancy documents for this work: ``AsyncExecutor``, for ``async
def`` jobs (its default ``ProcessExecutor`` would run each no-op in a child
process), and, for drains only, ``eager_polling=True`` ("poll immediately
after a job completes", for queues with a backlog; without it a drain waits
for the 5 s poll between fetches and ran at about 40 jobs/s here).
``Chancy.push`` enqueues in a transaction of its own.
Two configurations (``--config``): ``defaults``, the queue's default
concurrency (``concurrency=None``: the ``AsyncExecutor``'s default, 100);
``matched``, ``concurrency=N``.
Chancy has no drain mode: the worker runs until the database shows every
job ``succeeded`` (checked every 20 ms; chancy writes job results in batches
about once a second, which is part of what a user waits for).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

import psycopg
import workloads
from chancy import Chancy, Queue, Worker, job

_QUEUE = "bench"
_ASYNC_EXECUTOR = "chancy.executors.asyncex.AsyncExecutor"
_FILL_BATCH = 1000


def _no_arrival() -> None:
    return None


_arrival: workloads.Arrival = _no_arrival


@job(queue=_QUEUE)
async def noop() -> None:
    _arrival()


class ChancySide:
    def __init__(self, dsn: str, config: str) -> None:
        self.dsn = dsn
        self.config = config
        self.chancy = Chancy(dsn)

    async def setup(self) -> None:
        await self.chancy.__aenter__()
        await self.chancy.migrate()

    async def close(self) -> None:
        await self.chancy.__aexit__(None, None, None)

    async def _declare(self, concurrency: int, *, eager_polling: bool) -> None:
        await self.chancy.declare(
            Queue(
                _QUEUE,
                concurrency=None if self.config == "defaults" else concurrency,
                executor=_ASYNC_EXECUTOR,
                eager_polling=eager_polling,
            ),
            upsert=True,
        )

    async def enqueue(self) -> None:
        await self.chancy.push(noop)

    async def enqueue_batch(self, jobs: int) -> None:
        async for _ in self.chancy.push_many([noop] * jobs, batch_size=jobs):
            pass

    async def fill(self, jobs: int) -> None:
        async for _ in self.chancy.push_many([noop] * jobs, batch_size=_FILL_BATCH):
            pass
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("ANALYZE")

    async def drain(self, jobs: int, concurrency: int) -> float:
        await self._declare(concurrency, eager_polling=True)
        loop = asyncio.get_running_loop()
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            started = loop.time()
            async with Worker(self.chancy, register_signal_handlers=False):
                while True:  # chancy has no drain mode: the database is the witness
                    cursor = await conn.execute(
                        "SELECT count(*) FROM chancy_jobs WHERE state <> 'succeeded'"
                    )
                    row = await cursor.fetchone()
                    if row is not None and row[0] == 0:
                        return loop.time() - started
                    await asyncio.sleep(0.02)

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        global _arrival
        _arrival = arrival
        await self._declare(1, eager_polling=False)
        worker = Worker(self.chancy, register_signal_handlers=False)
        await worker.start()

        async def stop() -> None:
            await worker.stop()

        return stop


def _side(args: argparse.Namespace) -> ChancySide:
    return ChancySide(args.dsn, args.config)


if __name__ == "__main__":
    workloads.main(_side, __doc__ or "")
