"""The queue end to end on every state adapter x notify adapter pair.

Notify kinds: noop, in-process, Redis, Postgres LISTEN/NOTIFY, NATS and Redis
Cluster (a local 3-master cluster started once for this module by the
``redis_cluster`` fixture, only if a test asks for it).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import pytest

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import (
    DATABASES,
    HINTED_NOTIFY_KINDS,
    NOTIFY_KINDS,
    SHARED_NOTIFY_KINDS,
    ClaimPasses,
    CountingState,
    make_notify,
    other_tasks,
    wait_until,
)

pytestmark = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)
every_notify_kind = pytest.mark.parametrize("notify_kind", NOTIFY_KINDS, indirect=True)

pytest_plugins = ["tests.support.queue_fixtures"]


def _poll_interval(notify_kind: str) -> float:
    # Without notifications only the poll finds work; with them, a long poll proves
    # the notifications do.
    return 0.2 if notify_kind == "noop" else 60.0


@every_notify_kind
async def test_chains_with_continuations_and_blockers_complete(
    client: Client, notify_kind: str
) -> None:
    seen_blockers: list[str] = []

    async def step1(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("step2", {"n": job.input["n"], "trail": ["step1"]})

    async def step2(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("step3", {**job.input, "trail": [*job.input["trail"], "step2"]})

    async def step3(job: Job, ctx: JobContext) -> Any:
        return {"n": job.input["n"], "trail": [*job.input["trail"], "step3"]}

    async def summary(job: Job, ctx: JobContext) -> Any:
        for chain_id in job.input["blockers"]:
            seen_blockers.append((await client.get_chain(chain_id)).status)
        return {"summarized": len(job.input["blockers"])}

    chains = await client.start_chains([ChainSpec("step1", {"n": n}) for n in range(20)])
    blocker_ids = [chain.id for chain in chains[:5]]
    blocked = await client.start_chain("summary", {"blockers": blocker_ids}, blockers=blocker_ids)
    assert (await client.get_chain(blocked.id)).status == "blocked"

    handlers = {"step1": step1, "step2": step2, "step3": step3, "summary": summary}
    async with (
        Worker(client, handlers, concurrency=4, poll_interval=_poll_interval(notify_kind)),
        Worker(client, handlers, concurrency=4, poll_interval=_poll_interval(notify_kind)),
    ):
        for n, chain in enumerate(chains):
            done = await client.await_chain(chain.id, timeout=30, poll_interval=0.5)
            assert done.status == "completed"
            assert done.output == {"n": n, "trail": ["step1", "step2", "step3"]}
            assert done.last_job.chain_index == 2
        done = await client.await_chain(blocked.id, timeout=30, poll_interval=0.5)
        assert done.output == {"summarized": 5}
        assert seen_blockers == ["completed"] * 5

        # A blocker that has already completed does not hold anything back.
        late = await client.start_chain(
            "summary", {"blockers": blocker_ids[:1]}, blockers=blocker_ids[:1]
        )
        done = await client.await_chain(late.id, timeout=30, poll_interval=0.5)
        assert done.output == {"summarized": 1}
    await client.close()
    assert other_tasks() == set()


@every_notify_kind
async def test_failing_handler_is_retried_then_fails_after_max_attempts(
    client: Client, notify_kind: str
) -> None:
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        raise RuntimeError(f"attempt {job.attempt} failed")

    chain = await client.start_chain("doomed", {"x": 1}, max_attempts=3)
    async with Worker(
        client,
        {"doomed": handler},
        poll_interval=_poll_interval(notify_kind),
        retry_backoff=lambda attempt: 0.05,
        on_event=events.append,
    ):
        done = await client.await_chain(chain.id, timeout=30, poll_interval=0.5)
        await asyncio.sleep(0.05)
    assert done.status == "failed"
    assert done.last_job.attempt == 3
    assert "attempt 3 failed" in (done.last_job.last_error or "")
    kinds = [e.kind for e in events]
    assert kinds.count("started") == 3
    assert [k for k in kinds if k in ("retried", "failed")] == ["retried", "retried", "failed"]


@pytest.mark.parametrize("notify_kind", HINTED_NOTIFY_KINDS, indirect=True)
async def test_a_burst_of_jobs_wakes_only_as_many_idle_workers_as_it_has_jobs(
    client: Client, state: Any, notify_kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    workers, jobs = 6, 2
    completed = asyncio.Event()
    done: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        done.append(job.id)
        if len(done) == jobs:
            completed.set()

    async with AsyncExitStack() as stack:
        # Each worker has a client (and, on a server, a connection) of its own, as in
        # another process, and counts the SQL it asks for.
        passes = [ClaimPasses(state) for _ in range(workers)]
        states = [CountingState(watched) for watched in passes]
        for counting in states:
            shared = notify_kind in SHARED_NOTIFY_KINDS
            notify = client.notify if shared else make_notify(notify_kind, request, prefix)
            worker_client = Client(state=counting, notify=notify)
            if not shared:
                await stack.enter_async_context(worker_client)
            await stack.enter_async_context(
                Worker(worker_client, {"burst": handler}, concurrency=1, poll_interval=60)
            )
        # Every start-up claim pass is over, its last query (the next due time) answered:
        # one still running could find the burst and claim without a wakeup.
        await wait_until(lambda: all(watched.idle() for watched in passes))
        for counting in states:
            counting.calls.clear()

        await client.start_chains([ChainSpec("burst", {"n": n}) for n in range(jobs)])
        async with asyncio.timeout(10):
            await completed.wait()
        await asyncio.sleep(0.2)  # a straggler woken late would query now

    asked_sql = [s for s in states if s.calls.get("acquire", 0)]
    assert 1 <= len(asked_sql) <= jobs, [s.calls for s in states]
    # A worker that ran one of them asks the spent budget, not SQL, before claiming again.
    assert sum(s.calls.get("acquire", 0) for s in states) == jobs, [s.calls for s in states]
