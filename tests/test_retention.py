"""Retention: finished chains older than the window are deleted once, by whichever worker
or caller gets there first, and a chain an unfinished chain waits on is kept."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from queuert_notify import ChainNotFoundError, Client, InvalidInputError, Worker
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.testing import run_until_idle
from tests.support.queue_helpers import DATABASES, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]

pytestmark = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)

OLD = 1200


async def _done(job: Job, ctx: JobContext) -> Any:
    return None


async def _old_chains_and_a_blocker(client: Client) -> tuple[str, str]:
    """``OLD`` finished chains, plus a finished chain ``blocker`` that the unfinished
    chain ``dependent`` waited on (it is pending now: no worker handles its type)."""
    for start in range(0, OLD, 400):
        await client.start_chains([ChainSpec("old") for _ in range(start, start + 400)])
    blocker = await client.start_chain("old")
    dependent = await client.start_chain("held", blockers=[blocker.id])
    assert await run_until_idle(client, {"old": _done}, timeout=120) == OLD + 1
    assert (await client.get_chain(dependent.id)).status == "pending"
    return blocker.id, dependent.id


async def test_two_workers_with_retention_delete_each_old_chain_once_and_keep_blockers(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    blocker, dependent = await _old_chains_and_a_blocker(client)
    caplog.set_level(logging.INFO, logger="queuert_notify.maintenance.pruner")
    workers = [
        Worker(client, {"other": _done}, retention=timedelta(milliseconds=1), poll_interval=1)
        for _ in range(2)
    ]
    async with workers[0], workers[1]:

        async def only_the_blocker_and_its_dependent_left() -> bool:
            return (await client.list_chains(limit=10)).items.__len__() == 2

        await wait_until(only_the_blocker_and_its_dependent_left, timeout=60, interval=0.2)
        await asyncio.sleep(1.5)  # both pruners ran again: nothing more goes
    deleted = [r.chains for r in caplog.records if r.getMessage() == "pruned finished chains"]
    assert sum(deleted) == OLD
    assert (await client.get_chain(blocker)).status == "completed"
    assert (await client.get_chain(dependent)).status == "pending"
    assert sum((await client.count_jobs()).values()) == 2


async def test_concurrent_prunes_delete_each_chain_once_and_keep_blockers(client: Client) -> None:
    blocker, dependent = await _old_chains_and_a_blocker(client)
    counts = await asyncio.gather(
        *(client.prune(older_than=timedelta(0), batch_size=50) for _ in range(4))
    )
    assert sum(counts) == OLD
    assert (await client.get_chain(blocker)).status == "completed"
    assert await client.prune(older_than=timedelta(0)) == 0
    # Once the dependent's chain is final, both go.
    await client.cancel_chain(dependent)
    assert await client.prune(older_than=timedelta(0)) == 2
    with pytest.raises(ChainNotFoundError):
        await client.get_chain(blocker)


async def test_prune_keeps_chains_finished_within_the_window(client: Client) -> None:
    chain = await client.start_chain("old")
    await run_until_idle(client, {"old": _done})
    assert await client.prune(older_than=timedelta(hours=1)) == 0
    assert (await client.get_chain(chain.id)).status == "completed"
    with pytest.raises(InvalidInputError):
        await client.prune(older_than=timedelta(seconds=-1))
    with pytest.raises(InvalidInputError):
        await client.prune(older_than=7)  # type: ignore[arg-type]
