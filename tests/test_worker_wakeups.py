"""When a worker looks for work: notifications, wake hints, due times, free slots."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import (
    ClaimPasses,
    all_but_the_slowest,
    other_tasks,
    wait_until,
)

pytest_plugins = ["tests.support.queue_fixtures"]


@pytest.mark.timing
@pytest.mark.alone  # a bound in tenths of a second: not beside the suite
async def test_idle_worker_starts_a_new_job_within_100ms_despite_a_60s_poll(
    client: Client,
) -> None:
    started: dict[str, float] = {}

    async def handler(job: Job, ctx: JobContext) -> None:
        started[job.chain_id] = time.perf_counter()

    async with Worker(client, {"ping": handler}, poll_interval=60):
        await asyncio.sleep(0.2)  # the worker has polled once and is asleep
        latencies = []
        for _ in range(5):
            chain = await client.start_chain("ping")
            committed = time.perf_counter()
            await client.await_chain(chain.id, timeout=5)
            latencies.append(started[chain.id] - committed)
    assert all_but_the_slowest(latencies) < 0.1, latencies


async def test_exhausted_wake_budget_keeps_the_worker_out_of_sql(
    state: Any, notify: NotifyAdapter
) -> None:
    passes = ClaimPasses(state)
    async with Client(state=passes, notify=notify) as client:

        async def handler(job: Job, ctx: JobContext) -> None:
            return None

        async with Worker(client, {"t": handler}, poll_interval=60):
            # Its start-up claim is over (on a loaded machine it may end after 0.2 s).
            await wait_until(passes.idle)
            # A budget that exists and is used up: another worker already took the work.
            await notify.provide_wake_hint("t", 1)
            assert await notify.consume_wake_hint("t")
            before = passes.acquires
            await notify.notify_job_scheduled("t")
            await asyncio.sleep(0.2)
            assert passes.acquires == before
            # A budget with units left wakes the worker, which then queries SQL.
            await notify.notify_jobs_scheduled({"t": 1})
            await wait_until(lambda: passes.acquires > before, timeout=10)


@pytest.mark.parametrize("notify_kind", ["in_process", "redis"], indirect=True)
@pytest.mark.parametrize(("budget_left", "claims"), [(0, 1), (1, 2)])
async def test_an_announcement_heard_during_a_claim_asks_the_budget_before_the_next(
    state: Any, notify: NotifyAdapter, budget_left: int, claims: int
) -> None:
    passes = ClaimPasses(state)
    claiming, release = asyncio.Event(), asyncio.Event()
    passes_ended = 0
    acquire, next_due_at = passes.acquire, passes.next_due_at

    async def held_acquire(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        await release.wait()
        return await acquire(*args, **kwargs)

    async def counted_next_due_at(*args: Any, **kwargs: Any) -> Any:
        nonlocal passes_ended
        try:
            return await next_due_at(*args, **kwargs)
        finally:
            passes_ended += 1

    passes.acquire = held_acquire  # type: ignore[method-assign]
    passes.next_due_at = counted_next_due_at  # type: ignore[method-assign]
    heard = asyncio.Event()
    await notify.listen_job_scheduled(["t"], lambda _: heard.set())

    async def handler(job: Job, ctx: JobContext) -> None:
        return None

    async with (
        Client(state=passes, notify=notify) as client,
        Worker(client, {"t": handler}, poll_interval=60),
    ):
        await claiming.wait()  # the start-up claim is under way
        await notify.provide_wake_hint("t", 1 + budget_left)
        assert await notify.consume_wake_hint("t")  # another worker took one unit
        await notify.notify_job_scheduled("t")
        await heard.wait()  # the worker heard it too: one dispatch calls both
        release.set()
        # The start-up pass and the one the announcement woke have ended.
        await wait_until(lambda: passes_ended >= 2)
        # A spent budget keeps the worker out of SQL; a unit left sends it there.
        await wait_until(lambda: passes.acquires >= claims)
        assert passes.acquires == claims


async def test_worker_never_claims_a_type_it_has_no_handler_for(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> str:
        return "mine"

    other = await client.start_chain("someone-elses")
    mine = await client.start_chain("mine")
    async with Worker(client, {"mine": handler}, poll_interval=0.1):
        await client.await_chain(mine.id, timeout=5)
        await asyncio.sleep(0.3)
    other_chain = await client.get_chain(other.id)
    assert other_chain.status == "pending"
    assert other_chain.last_job.attempt == 0


async def test_delayed_job_runs_when_due_not_at_the_poll_interval(client: Client) -> None:
    started: dict[str, float] = {}

    async def handler(job: Job, ctx: JobContext) -> None:
        started[job.chain_id] = time.monotonic()

    async with Worker(client, {"later": handler}, poll_interval=60):
        await asyncio.sleep(0.1)
        enqueued = time.monotonic()
        chain = await client.start_chain("later", delay=0.5)
        await client.await_chain(chain.id, timeout=20)
    waited = started[chain.id] - enqueued
    # Not before it is due; long before the 60 s poll (room for a stalled machine).
    assert 0.45 <= waited < 10, waited


@pytest.mark.parametrize("notify_kind", ["noop"], indirect=True)
async def test_continuation_of_a_handled_type_runs_without_waiting_for_a_notification(
    client: Client,
) -> None:
    async def first(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("second", {"from": job.id})

    async def second(job: Job, ctx: JobContext) -> str:
        return "done"

    chain = await client.start_chain("first")
    # Done within 20 s means not on the 60 s poll.
    async with Worker(client, {"first": first, "second": second}, poll_interval=60):
        done = await client.await_chain(chain.id, timeout=20, poll_interval=0.05)
    assert done.output == "done"


async def test_worker_runs_at_most_concurrency_handlers_at_once(client: Client) -> None:
    running = 0
    peak = 0

    async def handler(job: Job, ctx: JobContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1

    chains = await client.start_chains([ChainSpec("t", {"n": n}) for n in range(30)])
    async with Worker(client, {"t": handler}, concurrency=4, poll_interval=60):
        for chain in chains:
            await client.await_chain(chain.id, timeout=10)
    assert peak == 4


async def test_stopped_worker_leaves_no_task_behind(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)

    await client.start_chains([ChainSpec("t") for _ in range(10)])
    worker = Worker(client, {"t": handler}, concurrency=3, poll_interval=60)
    async with worker:
        await asyncio.sleep(0.1)
    assert other_tasks() == set()
