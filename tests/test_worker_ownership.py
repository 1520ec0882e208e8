"""Leases: renewal keeps a long job, expiry hands it to another worker, loss cancels."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.errors import JobOwnershipLostError
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import job_events, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]


async def test_cancelling_a_chain_cancels_its_running_handler(client: Client) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    chain = await client.start_chain("long")
    async with Worker(client, {"long": handler}, on_event=job_events(events)):
        await asyncio.wait_for(started.wait(), 5)
        await client.cancel_chain(chain.id)
        await asyncio.wait_for(cancelled.wait(), 5)
    assert (await client.get_chain(chain.id)).status == "cancelled"
    assert [e.kind for e in events] == ["started", "ownership_lost"]


async def test_workerless_completion_wins_over_the_running_handler(client: Client) -> None:
    started = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> str:
        started.set()
        await asyncio.sleep(30)
        return "from the worker"

    chain = await client.start_chain("approval")
    async with Worker(client, {"approval": handler}):
        await asyncio.wait_for(started.wait(), 5)
        await client.complete_chain(chain.id, "approved by a human")
        await asyncio.sleep(0.3)
    done = await client.get_chain(chain.id)
    assert done.status == "completed"
    assert done.output == "approved by a human"


async def test_lease_is_renewed_while_a_long_handler_runs(client: Client) -> None:
    runs: list[int] = []

    async def handler(job: Job, ctx: JobContext) -> str:
        runs.append(job.attempt)
        await asyncio.sleep(7.5)
        return "finished"

    chain = await client.start_chain("long")
    # The handler outlives the lease twice. The lease leaves room for the event loop to
    # stall on a loaded machine (2 s and more): a stall longer than two thirds of a
    # lease costs the lease, as it would in production.
    async with (
        Worker(client, {"long": handler}, lease=3.6, worker_id="runner"),
        # A second worker reaping eagerly: it must find nothing expired.
        Worker(client, {"long": handler}, lease=3.6, reap_interval=0.1, poll_interval=0.1),
    ):
        done = await client.await_chain(chain.id, timeout=20)
    assert done.output == "finished"
    assert runs == [1]


async def test_a_dead_workers_expired_lease_is_reaped_and_run_again(
    client: Client, state: Any
) -> None:
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> int:
        return job.attempt

    chain = await client.start_chain("job")
    # A worker that claims the job and then dies without a word.
    (claimed,) = await state.acquire(["job"], worker_id="dead", lease_seconds=0.3)
    assert claimed.id == chain.id
    async with Worker(client, {"job": handler}, reap_interval=0.1, on_event=job_events(events)):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.output == 2
    assert ("reaped", chain.id) in [(e.kind, e.job_id) for e in events]


async def test_a_dead_workers_jobs_are_reaped_while_a_backlog_keeps_every_slot_busy(
    client: Client, state: Any
) -> None:
    ran: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        ran.append(job.chain_id)
        await asyncio.sleep(0.05)

    dead = await client.start_chain("job", {"n": -1})
    (claimed,) = await state.acquire(["job"], worker_id="dead", lease_seconds=0.3)
    assert claimed.id == dead.id
    # A backlog that outlasts the test: every claim fills the worker's only slot.
    await client.start_chains([ChainSpec("job", {"n": n}) for n in range(400)])
    async with Worker(client, {"job": handler}, concurrency=1, reap_interval=0.2):
        done = await client.await_chain(dead.id, timeout=10.0)
        assert done.status == "completed"
        assert (await client.count_jobs()).get("pending", 0) > 100  # the backlog is still there


@pytest.mark.parametrize("notify_kind", ["noop"], indirect=True)
async def test_heartbeat_raises_once_the_job_is_no_longer_ours(client: Client) -> None:
    outcome: list[str] = []
    events: list[WorkerEvent] = []
    started = asyncio.Event()
    proceed = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> None:
        await ctx.heartbeat()
        outcome.append("first heartbeat ok")
        started.set()
        await proceed.wait()
        try:
            await ctx.heartbeat()
        except JobOwnershipLostError:
            outcome.append("lost")
            raise

    chain = await client.start_chain("t")
    # No notifications and a long lease: only the heartbeat can notice the cancel.
    async with Worker(client, {"t": handler}, lease=30, on_event=job_events(events)):
        await asyncio.wait_for(started.wait(), 5)
        await client.cancel_chain(chain.id)
        proceed.set()
        await wait_until(lambda: len(events) == 2, timeout=5)
    assert outcome == ["first heartbeat ok", "lost"]
    assert [e.kind for e in events] == ["started", "ownership_lost"]
    assert (await client.get_chain(chain.id)).status == "cancelled"


@pytest.mark.parametrize("notify_kind", ["in_process"], indirect=True)
async def test_forged_ownership_lost_notification_does_not_cancel_a_job_still_owned(
    client: Client, notify: NotifyAdapter
) -> None:
    started = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "survived"

    chain = await client.start_chain("t")
    async with Worker(client, {"t": handler}):
        await asyncio.wait_for(started.wait(), 5)
        await notify.notify_job_ownership_lost(chain.id)
        done = await client.await_chain(chain.id, timeout=5)
    assert done.output == "survived"


class _PerJobOwnershipOnly(InProcessNotifyAdapter):
    """Like Redis Cluster's channel per job: no one channel carries every job's loss."""

    async def listen_every_job_ownership_lost(self, callback: Any) -> None:
        return None


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)
async def test_a_run_listens_on_its_own_where_no_channel_carries_every_jobs_loss(
    state: Any,
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with Client(state=state, notify=_PerJobOwnershipOnly()) as client:
        chain = await client.start_chain("long")
        # The lease (30 s) is far longer than the wait: only the run's own listen cancels it.
        async with Worker(client, {"long": handler}, lease=30):
            await asyncio.wait_for(started.wait(), 5)
            await client.cancel_chain(chain.id)
            await asyncio.wait_for(cancelled.wait(), 5)
        assert (await client.get_chain(chain.id)).status == "cancelled"
