"""Running a failed or cancelled chain again (``Client.retry_chain``), on SQLite and
Postgres."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queuert_notify.client.client import Client
from queuert_notify.errors import ChainNotFoundError, InvalidInputError
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import DATABASES

pytest_plugins = ["tests.support.queue_fixtures"]

pytestmark = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)


def _no_wait(attempt: int) -> float:
    return 0.0


async def test_a_failed_chain_runs_again_from_its_last_job_with_fresh_attempts(
    client: Client,
) -> None:
    broken = True
    attempts: list[tuple[str, int]] = []

    async def first(job: Job, ctx: JobContext) -> Any:
        attempts.append((job.type_name, job.attempt))
        return ctx.continue_with("second", {"n": 1})

    async def second(job: Job, ctx: JobContext) -> str:
        attempts.append((job.type_name, job.attempt))
        if broken:
            raise RuntimeError("dependency down")
        return "done"

    chain = await client.start_chain("first", max_attempts=2)
    handlers = {"first": first, "second": second}
    async with Worker(client, handlers, retry_backoff=_no_wait):
        failed = await client.await_chain(chain.id, timeout=10)
        assert failed.status == "failed"
        broken = False
        retried = await client.retry_chain(chain.id)
        assert retried.status == "pending"
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "completed" and done.output == "done"
    # The first job is not run again; the last one gets its two attempts anew.
    assert attempts == [("first", 1), ("second", 1), ("second", 2), ("second", 1)]


async def test_a_cancelled_chain_runs_again(client: Client) -> None:
    chain = await client.start_chain("later", delay=3600)
    await client.cancel_chain(chain.id)
    await client.retry_chain(chain.id)
    async with Worker(client, {"later": lambda job, ctx: "ran"}):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.output == "ran"


async def test_a_retried_chain_waits_again_for_an_unfinished_blocker(client: Client) -> None:
    blocker = await client.start_chain("blocker", delay=3600)
    waiting = await client.start_chain("waiting", blockers=[blocker.id])
    await client.cancel_chain(waiting.id)
    await client.retry_chain(waiting.id)
    assert (await client.get_chain(waiting.id)).status == "blocked"
    async with Worker(client, {"blocker": lambda job, ctx: 1, "waiting": lambda job, ctx: 2}):
        await asyncio.sleep(0.3)
        assert (await client.get_chain(waiting.id)).status == "blocked"
        await client.trigger_chain(blocker.id)
        done = await client.await_chain(waiting.id, timeout=10)
    assert done.output == 2


async def test_only_failed_or_cancelled_chains_can_be_retried(client: Client) -> None:
    pending = await client.start_chain("job")
    with pytest.raises(InvalidInputError, match="is pending: only a failed or cancelled"):
        await client.retry_chain(pending.id)
    with pytest.raises(ChainNotFoundError):
        await client.retry_chain("no-such-chain")
    assert (await client.get_chain(pending.id)).status == "pending"
