"""Awaiting, inspecting and acting on chains from application code."""

from __future__ import annotations

import asyncio
import time

import pytest

from queuert_notify.client.client import Client
from queuert_notify.errors import ChainNotFoundError, WaitChainTimeoutError
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import other_tasks

pytest_plugins = ["tests.support.queue_fixtures"]


async def test_await_chain_is_woken_by_the_completion_notification(client: Client) -> None:
    chain = await client.start_chain("approval", {"doc": 7})

    async def approve_later() -> None:
        await asyncio.sleep(0.2)
        await client.complete_chain(chain.id, {"approved": True})

    approver = asyncio.create_task(approve_later())
    # No timeout of its own: re-read after 30 s only, so done before that means woken.
    async with asyncio.timeout(20):
        done = await client.await_chain(chain.id, poll_interval=30)
    await approver
    assert done.status == "completed"
    assert done.output == {"approved": True}


@pytest.mark.parametrize("notify_kind", ["noop"], indirect=True)
async def test_await_chain_reads_the_database_when_no_notification_arrives(
    client: Client,
) -> None:
    chain = await client.start_chain("approval")

    async def approve_later() -> None:
        await asyncio.sleep(0.1)
        await client.complete_chain(chain.id, "ok")

    approver = asyncio.create_task(approve_later())
    done = await client.await_chain(chain.id, timeout=10, poll_interval=0.2)
    await approver
    assert done.output == "ok"


async def test_await_chain_gives_up_with_wait_chain_timeout_error(client: Client) -> None:
    chain = await client.start_chain("nobody-handles-this")
    started = time.monotonic()
    with pytest.raises(WaitChainTimeoutError, match="pending"):
        await client.await_chain(chain.id, timeout=0.3)
    assert time.monotonic() - started < 10  # given up, not waiting for the handler


async def test_await_chain_leaves_no_subscription_or_task_behind(client: Client) -> None:
    chain = await client.start_chain("nobody-handles-this")
    with pytest.raises(WaitChainTimeoutError):
        await client.await_chain(chain.id, timeout=0.1)
    assert other_tasks() == set()


async def test_unknown_chain_raises_chain_not_found(client: Client) -> None:
    with pytest.raises(ChainNotFoundError):
        await client.await_chain("no-such-chain", timeout=1)
    with pytest.raises(ChainNotFoundError):
        await client.get_chain("no-such-chain")


async def test_cancelled_chain_is_final_and_never_runs(client: Client) -> None:
    ran: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        ran.append(job.id)

    chain = await client.start_chain("later", delay=0.3)
    cancelled = await client.cancel_chain(chain.id)
    assert cancelled.status == "cancelled"
    async with Worker(client, {"later": handler}, poll_interval=0.1):
        await asyncio.sleep(0.6)
    assert ran == []
    assert (await client.await_chain(chain.id, timeout=1)).status == "cancelled"


async def test_trigger_makes_a_delayed_chain_due_now(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> str:
        return "ran"

    chain = await client.start_chain("later", delay=3600)
    async with Worker(client, {"later": handler}, poll_interval=60):
        await client.trigger_chain(chain.id)
        done = await client.await_chain(chain.id, timeout=5)
    assert done.output == "ran"


async def test_deleted_chain_is_gone(client: Client) -> None:
    chain = await client.start_chain("t")
    await client.delete_chain(chain.id)
    with pytest.raises(ChainNotFoundError):
        await client.get_chain(chain.id)


async def test_list_chains_and_jobs_show_what_was_started(client: Client) -> None:
    first = await client.start_chain("report", {"n": 1})
    second = await client.start_chain("email", {"n": 2})
    listed = await client.list_chains()
    assert {c.id for c in listed.items} == {first.id, second.id}
    only_email = await client.list_chains(type_name="email")
    assert [c.id for c in only_email.items] == [second.id]
    jobs = await client.list_jobs(chain_id=first.id)
    assert [j.input for j in jobs.items] == [{"n": 1}]
    assert (await client.get_job(jobs.items[0].id)).chain_id == first.id
