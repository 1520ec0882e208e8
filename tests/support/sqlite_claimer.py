"""A separate process that claims and completes jobs from a SQLite file until none are
left, printing each claimed job id on its own line (used by test_state_sqlite).

It prints ``ready`` once connected, then waits for a line on stdin, so that every
process starts claiming at the same moment."""

from __future__ import annotations

import asyncio
import random
import sys

from sqlalchemy.ext.asyncio import create_async_engine

from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion
from state_adapters.notifications import NotificationBuffer


async def claim_until_empty(path: str, table_prefix: str, worker_id: str) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
    try:
        await state.count_jobs()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        idle_rounds = 0
        while idle_rounds < 3:
            jobs = await state.acquire(
                ["t"], worker_id=worker_id, lease_seconds=300, limit=random.randint(1, 3)
            )
            if not jobs:
                idle_rounds += 1
                await asyncio.sleep(0.05)
                continue
            idle_rounds = 0
            for job in jobs:
                print(job.id, flush=True)
            # A moment of "work" outside any transaction, as a real handler has;
            # without it one process can starve the other (SQLite's busy handler
            # polls), which is fair to neither the test nor reality.
            await asyncio.sleep(0.005)
            await state.complete_jobs(
                [Completion(job.id, job.lease_token or "", output=worker_id) for job in jobs],
                notes=NotificationBuffer(),
            )
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(claim_until_empty(*sys.argv[1:4]))
