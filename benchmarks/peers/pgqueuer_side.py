"""pgqueuer's side of ``python -m benchmarks peers`` (runs in the peers' virtualenv).

Configuration, as pgqueuer's README sets it up: the asyncpg driver
(``AsyncpgDriver``, one connection for the producer, one for the worker's
``QueueManager``), the schema of ``pgq install`` (its insert trigger sends the
LISTEN/NOTIFY wakeup the worker waits on), ``Queries.enqueue`` on an
autocommit connection (one statement: its own transaction); drains use
``mode=drain``, which returns once the queue is empty and the completion log
is flushed.

Two configurations (``--config``) of the worker (``QueueManager.run``):

- ``defaults``: its defaults, ``batch_size=10`` and no ``max_concurrent_tasks``
  (no cap on running jobs): the one its README runs;
- ``matched``: concurrency N as ``max_concurrent_tasks=N`` with
  ``batch_size=N // 2`` (pgqueuer requires the cap to be at least twice the
  batch).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import workloads
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

_ENTRYPOINT = "noop"
_FILL_BATCH = 1000


class PgqueuerSide:
    def __init__(self, dsn: str, config: str) -> None:
        self.dsn = dsn
        self.config = config
        self.connections: list[asyncpg.Connection] = []

    async def _connect(self) -> asyncpg.Connection:
        connection = await asyncpg.connect(self.dsn)
        self.connections.append(connection)
        return connection

    async def setup(self) -> None:
        self.queries = Queries(AsyncpgDriver(await self._connect()))
        await self.queries.install()

    async def close(self) -> None:
        for connection in self.connections:
            await connection.close()

    async def enqueue(self) -> None:
        await self.queries.enqueue(_ENTRYPOINT, None)

    async def enqueue_batch(self, jobs: int) -> None:
        await self.queries.enqueue([_ENTRYPOINT] * jobs, [None] * jobs, [0] * jobs)

    async def fill(self, jobs: int) -> None:
        for offset in range(0, jobs, _FILL_BATCH):
            await self.enqueue_batch(min(_FILL_BATCH, jobs - offset))
        await self.connections[0].execute("ANALYZE")

    async def _manager(self, handler: Callable[[Job], Awaitable[None]]) -> QueueManager:
        manager = QueueManager(Queries(AsyncpgDriver(await self._connect())))
        manager.entrypoint(_ENTRYPOINT)(handler)
        return manager

    async def drain(self, jobs: int, concurrency: int) -> float:
        async def noop(job: Job) -> None:
            return None

        manager = await self._manager(noop)
        started = asyncio.get_running_loop().time()
        await manager.run(**self._limits(concurrency), mode=QueueExecutionMode.drain)
        seconds = asyncio.get_running_loop().time() - started
        left = await self.connections[0].fetchval("SELECT count(*) FROM pgqueuer")
        if left:
            raise RuntimeError(f"pgqueuer drain returned with {left} jobs left")
        return seconds

    def _limits(self, concurrency: int) -> dict[str, int]:
        if self.config == "defaults":
            return {}
        half = max(1, concurrency // 2)
        return {"batch_size": half, "max_concurrent_tasks": 2 * half}

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        async def handler(job: Job) -> None:
            arrival()

        manager = await self._manager(handler)
        task = asyncio.create_task(manager.run(**self._limits(1)))

        async def stop() -> None:
            manager.shutdown.set()
            await task

        return stop


def _side(args: argparse.Namespace) -> PgqueuerSide:
    return PgqueuerSide(args.dsn, args.config)


if __name__ == "__main__":
    workloads.main(_side, __doc__ or "")
