"""Oban for Python's side of ``python -m benchmarks peers`` (runs in a virtualenv of
its own on Python 3.12 or later, which Oban for Python requires).

Configuration, as its README sets it up: a pool from ``Oban.create_pool(dsn)``
(psycopg 3, at most 10 connections), the schema of ``oban.schema.install``
(``public`` of the round's own database), a client-mode ``Oban(pool=pool)``
whose ``enqueue`` inserts one job in a transaction of its own and whose
``enqueue_many`` inserts a batch in one statement (both also take ``conn=``
for a transactional enqueue in the caller's transaction). The worker is an
``Oban`` of its own (its own pool, as on another machine) running queue
``default``; its insert trigger's NOTIFY wakes the producer. Oban has no drain
mode: the worker runs until the database shows every job ``completed``
(checked every 20 ms; Oban acknowledges jobs in batches).

Two configurations (``--config``): ``defaults``, the README's queue limit of 10
(also the producer's default ``limit``); ``matched``, ``queues={queue: N}``.
At N = 10 they are the same worker, so the benchmark runs one of them.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import workloads
from oban import Oban, worker
from oban.schema import install

_QUEUE = "default"
_DEFAULT_LIMIT = 10
_FILL_BATCH = 1000


def _no_arrival() -> None:
    return None


_arrival: workloads.Arrival = _no_arrival


@worker(queue=_QUEUE)
class Noop:
    async def process(self, job: Any) -> None:
        _arrival()


class ObanSide:
    def __init__(self, dsn: str, config: str) -> None:
        self.dsn = dsn
        self.config = config

    async def setup(self) -> None:
        self.pool = await Oban.create_pool(self.dsn)
        await install(self.pool)
        self.client = Oban(pool=self.pool)

    async def close(self) -> None:
        await self.pool.close()

    async def enqueue(self) -> None:
        await self.client.enqueue(Noop.new({}))

    async def enqueue_batch(self, jobs: int) -> None:
        await self.client.enqueue_many([Noop.new({}) for _ in range(jobs)])

    async def fill(self, jobs: int) -> None:
        for offset in range(0, jobs, _FILL_BATCH):
            await self.enqueue_batch(min(_FILL_BATCH, jobs - offset))
        async with self.pool.connection() as conn:
            await conn.execute("ANALYZE")

    async def _count_unfinished(self) -> int:
        async with self.pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) FROM oban_jobs WHERE state <> 'completed'")
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _worker(self, concurrency: int) -> tuple[Oban, Any]:
        limit = _DEFAULT_LIMIT if self.config == "defaults" else concurrency
        pool = await Oban.create_pool(self.dsn)
        return Oban(pool=pool, queues={_QUEUE: limit}, name="bench-worker"), pool

    async def drain(self, jobs: int, concurrency: int) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        oban, pool = await self._worker(concurrency)
        try:
            async with oban:
                while await self._count_unfinished():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                return loop.time() - started
        finally:
            await pool.close()

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        global _arrival
        _arrival = arrival
        oban, pool = await self._worker(1)
        await oban.start()

        async def stop() -> None:
            await oban.stop()
            await pool.close()

        return stop


def _side(args: argparse.Namespace) -> ObanSide:
    return ObanSide(args.dsn, args.config)


if __name__ == "__main__":
    workloads.main(_side, __doc__ or "")
