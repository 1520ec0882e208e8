"""awa's side of ``python -m benchmarks peers`` (runs in the peers' virtualenv).

Configuration, as awa-pg's README sets it up: ``awa.AsyncClient(dsn)`` (its
Rust core's pool, 10 connections), the schema of ``client.migrate()`` (schema
``awa`` in the round's own database), ``client.insert(args)`` for one job in a
transaction of its own, ``client.transaction()`` with ``insert_many`` for a
batch (the transactional enqueue: the jobs commit with the transaction). The
worker is a client of its own (as on another machine) with the no-op handler
registered by ``client.task``; awa wakes it with LISTEN/NOTIFY and polls every
200 ms. awa has no drain mode: the driver counts handler calls, then reads
``queue_stats()`` every 20 ms until no job is queued or running (completions
are recorded in batches by the Rust runtime).

Two configurations (``--config``): ``defaults``, ``client.start()`` with no
queue list (the registered queue with awa's default of 10 workers, measured
here: 10 handlers ran at once); ``matched``, ``client.start([(queue, N)])``.
At N = 10 they are the same worker, so the benchmark runs one of them.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import awa
import workloads

_QUEUE = "default"
_FILL_BATCH = 1000


@dataclass
class Noop:
    """The no-op job's arguments: none."""


class AwaSide:
    def __init__(self, dsn: str, config: str) -> None:
        self.dsn = dsn
        self.config = config
        self.client = awa.AsyncClient(dsn)

    async def setup(self) -> None:
        await self.client.migrate()

    async def close(self) -> None:
        await self.client.close()

    async def enqueue(self) -> None:
        await self.client.insert(Noop(), queue=_QUEUE)

    async def enqueue_batch(self, jobs: int) -> None:
        async with await self.client.transaction() as tx:
            await tx.insert_many([Noop() for _ in range(jobs)], queue=_QUEUE)

    async def fill(self, jobs: int) -> None:
        for offset in range(0, jobs, _FILL_BATCH):
            await self.enqueue_batch(min(_FILL_BATCH, jobs - offset))
        async with await self.client.transaction() as tx:
            await tx.execute("ANALYZE")

    async def _worker(self, handler: Callable[[], None], concurrency: int) -> awa.AsyncClient:
        worker = awa.AsyncClient(self.dsn)

        @worker.task(Noop, queue=_QUEUE)
        async def noop(job: awa.Job) -> None:
            handler()

        if self.config == "defaults":
            await worker.start()
        else:
            await worker.start([(_QUEUE, concurrency)])
        return worker

    async def drain(self, jobs: int, concurrency: int) -> float:
        handled = 0

        def count() -> None:
            nonlocal handled
            handled += 1

        loop = asyncio.get_running_loop()
        started = loop.time()
        worker = await self._worker(count, concurrency)
        try:
            while True:  # no drain mode: awa's own statistics are the witness
                await asyncio.sleep(0.02)
                if handled < jobs:
                    continue
                stats = [s for s in await self.client.queue_stats() if s.queue == _QUEUE]
                if all(s.total_queued == 0 and s.running == 0 for s in stats):
                    return loop.time() - started
        finally:
            await worker.shutdown()
            await worker.close()

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        worker = await self._worker(arrival, 1)

        async def stop() -> None:
            await worker.shutdown()
            await worker.close()

        return stop


def _side(args: argparse.Namespace) -> AwaSide:
    return AwaSide(args.dsn, args.config)


if __name__ == "__main__":
    workloads.main(_side, __doc__ or "")
