"""``queuert_notify.testing.run_until_idle``: the same test code drains the queue on
SQLite + in-process notify and on Postgres + Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queuert_notify import Client, Job, JobContext
from queuert_notify.testing import run_until_idle

pytest_plugins = ["tests.support.queue_fixtures"]

pytestmark = pytest.mark.parametrize(
    ("state_kind", "notify_kind"),
    [("sqlite", "in_process"), ("postgres", "redis")],
    indirect=True,
)


async def test_a_chain_runs_through_its_continuations(client: Client) -> None:
    async def first(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("second", {"n": job.input["n"] + 1})

    async def second(job: Job, ctx: JobContext) -> Any:
        return {"n": job.input["n"] * 10}

    chain = await client.start_chain("first", {"n": 1})

    ran = await run_until_idle(client, {"first": first, "second": second})

    assert ran == 2
    done = await client.get_chain(chain.id)
    assert (done.status, done.output) == ("completed", {"n": 20})


async def test_a_blocked_chain_runs_once_its_blocker_finished(client: Client) -> None:
    order: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> Any:
        order.append(job.type_name)
        return job.type_name

    blocker = await client.start_chain("fetch")
    blocked = await client.start_chain("report", blockers=[blocker.id])

    ran = await run_until_idle(client, {"fetch": handler, "report": handler})

    assert ran == 2 and order == ["fetch", "report"]
    assert (await client.get_chain(blocked.id)).status == "completed"


async def test_a_job_that_is_not_due_yet_neither_runs_nor_is_waited_for(client: Client) -> None:
    ran_types: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> Any:
        ran_types.append(job.type_name)

    later = await client.start_chain("reminder", delay=3600)
    now = await client.start_chain("welcome")

    loop = asyncio.get_running_loop()
    started = loop.time()
    ran = await run_until_idle(client, {"reminder": handler, "welcome": handler})

    assert ran == 1 and ran_types == ["welcome"]
    assert loop.time() - started < 5
    assert (await client.get_chain(now.id)).status == "completed"
    assert (await client.get_chain(later.id)).status == "pending"


async def test_nothing_to_do_returns_zero_at_once(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> Any:
        return None

    assert await run_until_idle(client, {"t": handler}) == 0


async def test_a_queue_that_never_goes_idle_is_a_timeout_naming_what_is_left(
    client: Client,
) -> None:
    async def handler(job: Job, ctx: JobContext) -> Any:
        return None

    unrunnable = await client.start_chain("not-handled-here")
    await client.start_chain("t", blockers=[unrunnable.id])

    with pytest.raises(TimeoutError) as raised:
        await run_until_idle(client, {"t": handler}, timeout=0.5)

    message = str(raised.value)
    assert message.startswith("run_until_idle: the queue was not idle after 0.5s")
    assert "1 blocked" in message and "types t" in message


async def test_a_limited_type_runs_every_due_job_before_it_returns(client: Client) -> None:
    # One at a time: between a completion and the next claim, the other jobs are due
    # and wait only for the slot, so they keep the run going.
    await client.set_limits("limited", concurrency=1)
    chains = [await client.start_chain("limited", {"n": n}) for n in range(4)]
    ran_inputs: list[int] = []

    async def handler(job: Job, ctx: JobContext) -> Any:
        ran_inputs.append(job.input["n"])

    ran = await run_until_idle(client, {"limited": handler})

    assert ran == 4 and sorted(ran_inputs) == [0, 1, 2, 3]
    assert [(await client.get_chain(c.id)).status for c in chains] == ["completed"] * 4
