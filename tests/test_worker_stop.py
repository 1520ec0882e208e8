"""Stopping a worker: drain, drain timeout, force, and nothing left behind."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import job_events, other_tasks

pytest_plugins = ["tests.support.queue_fixtures"]


async def test_stop_lets_running_jobs_finish_and_claims_nothing_new(client: Client) -> None:
    started = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    running = await client.start_chain("t")
    worker = Worker(client, {"t": handler}, concurrency=1)
    async with worker:
        await asyncio.wait_for(started.wait(), 5)
        waiting = await client.start_chain("t")
        await worker.stop()
        assert (await client.get_chain(running.id)).output == "finished"
    assert (await client.get_chain(waiting.id)).status == "pending"
    assert worker.abandoned_jobs == 0
    assert other_tasks() == set()


async def test_stop_cancels_handlers_still_running_after_the_drain_timeout(
    client: Client,
) -> None:
    started = asyncio.Event()
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    chain = await client.start_chain("t")
    worker = Worker(client, {"t": handler}, drain_timeout=0.2, on_event=job_events(events))
    async with worker:
        await asyncio.wait_for(started.wait(), 5)
        began = time.monotonic()
        await worker.stop()
        assert time.monotonic() - began < 10  # the handler would take 30 s
    # Still leased: it is retried by any worker once the lease expires.
    assert (await client.get_chain(chain.id)).status == "running"
    assert [e.kind for e in events] == ["started", "abandoned"]
    assert worker.abandoned_jobs == 1
    assert other_tasks() == set()


async def test_forced_stop_skips_the_drain(client: Client) -> None:
    started = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    await client.start_chain("t")
    worker = Worker(client, {"t": handler}, drain_timeout=30)
    async with worker:
        await asyncio.wait_for(started.wait(), 5)
        began = time.monotonic()
        await worker.stop(force=True)
        assert time.monotonic() - began < 10  # the drain would take 30 s
    assert other_tasks() == set()


async def test_run_returns_after_stop_from_another_task(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> None:
        return None

    worker = Worker(client, {"t": handler})
    runner = asyncio.create_task(worker.run(handle_signals=False))
    await asyncio.sleep(0.1)
    await worker.stop()
    assert runner.done()
    await runner


async def test_a_stop_signal_says_what_happens_and_names_each_abandoned_job(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()

    async def stuck(job: Job, ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    chain = await client.start_chain("stuck")
    worker = Worker(client, {"stuck": stuck}, drain_timeout=0.3)
    caplog.set_level(logging.WARNING)
    running = asyncio.create_task(worker.run())  # handles SIGTERM/SIGINT
    await asyncio.wait_for(started.wait(), 10)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(running, 10)
    job_id = (await client.get_chain(chain.id)).last_job.id
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "stopping: draining 1 running jobs (up to 0.3 s; press Ctrl-C again to stop now)"
    )
    assert (
        f"abandoned job {job_id} of type 'stuck' (worker stopped); it runs again once its "
        "lease expires"
    ) in lines
    assert worker.abandoned_jobs == 1
