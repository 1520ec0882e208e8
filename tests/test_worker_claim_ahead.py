"""Jobs claimed ahead of the free slots while a worker drains a backlog: never more
handlers at once than ``concurrency``, each job run once, none left leased by a
graceful stop, and a lease lost while waiting means the job is not run here."""

from __future__ import annotations

import asyncio

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import job_events, other_tasks

pytest_plugins = ["tests.support.queue_fixtures"]


async def test_a_backlog_runs_each_job_once_and_never_above_concurrency(client: Client) -> None:
    running = 0
    most = 0
    seen: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        seen.append(job.id)
        await asyncio.sleep(0.001)
        running -= 1

    chains = await client.start_chains([ChainSpec("t") for _ in range(60)])
    async with Worker(client, {"t": handler}, concurrency=3, claim_ahead=True):
        for chain in chains:
            assert (await client.await_chain(chain.id, timeout=30)).status == "completed"
    assert most <= 3
    assert sorted(seen) == sorted(chain.id for chain in chains)


async def test_a_graceful_stop_runs_the_jobs_claimed_ahead(client: Client) -> None:
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        await asyncio.sleep(0.005)

    await client.start_chains([ChainSpec("t") for _ in range(300)])
    worker = Worker(
        client, {"t": handler}, concurrency=4, claim_ahead=True, on_event=job_events(events)
    )
    async with worker:
        while sum(e.kind == "completed" for e in events) < 20:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await worker.stop()
    counts = await client.count_jobs()
    # Whatever the worker claimed (running or ahead) it ran; the rest waits for others.
    assert counts.get("running", 0) == 0
    assert worker.abandoned_jobs == 0
    assert other_tasks() == set()


async def test_a_job_cancelled_while_it_waits_ahead_is_not_completed_here(
    client: Client,
) -> None:
    events: list[WorkerEvent] = []
    release = asyncio.Event()
    calls = 0

    async def handler(job: Job, ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls > 6:  # a backlog first (claims go ahead), then both slots held
            await release.wait()

    chains = await client.start_chains([ChainSpec("t") for _ in range(40)])
    worker = Worker(
        client, {"t": handler}, concurrency=2, claim_ahead=True, on_event=job_events(events)
    )
    async with worker:
        while calls < 8:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        # Every job not started yet (waiting ahead, or pending) is cancelled.
        started = {e.job_id for e in events if e.kind == "started"}
        cancelled = [c for c in chains if c.id not in started]
        for chain in cancelled:
            await client.cancel_chain(chain.id)
        release.set()
        await asyncio.sleep(0.5)
    completed = {e.job_id for e in events if e.kind == "completed"}
    assert completed.isdisjoint(c.id for c in cancelled)
    for chain in cancelled:
        assert (await client.get_chain(chain.id)).status == "cancelled"
