"""With Redis notify and a 60 s poll interval, an idle worker in its own client starts a
new job within 100 ms of the enqueuing transaction's commit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import all_but_the_slowest, make_notify

pytest_plugins = ["tests.support.queue_fixtures"]


@pytest.mark.timing
@pytest.mark.alone  # a bound in tenths of a second: not beside the suite
@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
async def test_idle_worker_starts_a_job_within_100ms_with_a_60s_poll(
    client: Client,
    state: Any,
    engine: AsyncEngine,
    request: pytest.FixtureRequest,
    prefix: str,
) -> None:
    started: dict[str, float] = {}

    async def handler(job: Job, ctx: JobContext) -> None:
        started[job.chain_id] = time.perf_counter()

    # The worker has a Redis connection of its own, as in another process.
    worker_client = Client(state=state, notify=make_notify("redis", request, prefix))
    async with worker_client, Worker(worker_client, {"ping": handler}, poll_interval=60):
        await asyncio.sleep(0.3)  # polled once; now asleep until a notification
        latencies = []
        for i in range(10):
            async with AsyncSession(engine) as session:
                async with session.begin():
                    chain = await client.start_chain("ping", {"i": i}, session=session)
                committed = time.perf_counter()
            await client.await_chain(chain.id, timeout=5)
            latencies.append(started[chain.id] - committed)
            await asyncio.sleep(0.05)
    assert all_but_the_slowest(latencies) < 0.1, latencies
