"""A job's own log lines: kept per attempt across retries (and when an atomic attempt's
transaction rolls back), bounded per attempt, written while the job runs, read in order
from a position, and deleted with the chain."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, insert

from queuert_notify import JobLogHandler
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import DATABASES, STATE_KINDS, other_tasks, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]

# What a database can store of a line is the driver's business: every driver. The
# worker's keeping of lines lies above it: SQLite and Postgres.
every_driver = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
both_databases = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)

app_logger = logging.getLogger("tests.job_logs.app")


@pytest.fixture
def job_log_handler() -> AsyncIterator[JobLogHandler]:
    handler = JobLogHandler()
    app_logger.addHandler(handler)
    app_logger.setLevel(logging.INFO)
    yield handler
    app_logger.removeHandler(handler)


@both_databases
async def test_lines_are_kept_per_attempt_across_a_retry(
    client: Client, job_log_handler: JobLogHandler
) -> None:
    async def flaky(job: Job, ctx: JobContext) -> str:
        ctx.log("starting", attempt=job.attempt)
        app_logger.warning("through logging, attempt %d", job.attempt)
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "done"

    app_logger.info("outside any job: not kept")
    chain = await client.start_chain("flaky", max_attempts=3)
    async with Worker(client, {"flaky": flaky}, retry_backoff=lambda attempt: 0.0):
        done = await client.await_chain(chain.id, timeout=20)
    assert done.status == "completed"
    lines = await client.job_logs(chain.id)
    assert [(line.attempt, line.seq, line.level, line.message) for line in lines] == [
        (1, 1, "INFO", "starting"),
        (1, 2, "WARNING", "through logging, attempt 1"),
        (2, 1, "INFO", "starting"),
        (2, 2, "WARNING", "through logging, attempt 2"),
    ]
    assert lines[0].fields == {"attempt": 1}
    assert lines[1].fields == {"logger": "tests.job_logs.app"}
    # Read on from a position: only the later lines.
    later = await client.job_logs(chain.id, after=(1, 2))
    assert [(line.attempt, line.seq) for line in later] == [(2, 1), (2, 2)]


@both_databases
async def test_a_plain_def_handler_logs_from_its_thread(
    client: Client, job_log_handler: JobLogHandler
) -> None:
    def blocking(job: Job, ctx: JobContext) -> None:
        ctx.log("from the thread")
        app_logger.info("logged in the thread")

    chain = await client.start_chain("blocking")
    async with Worker(client, {"blocking": blocking}):
        await client.await_chain(chain.id, timeout=20)
    messages = [line.message for line in await client.job_logs(chain.id)]
    assert messages == ["from the thread", "logged in the thread"]


@both_databases
async def test_an_atomic_attempt_that_fails_keeps_its_lines(
    client: Client, engine: Any, table_prefix: str
) -> None:
    notes = Table(f"{table_prefix}app_notes", MetaData(), Column("job_id", String(64)))
    async with engine.begin() as conn:
        await conn.run_sync(notes.create)

    async def handler(job: Job, ctx: JobContext) -> None:
        await ctx.session.execute(insert(notes).values(job_id=job.id))
        ctx.log("wrote the note", attempt=job.attempt)
        raise RuntimeError("after writing")

    chain = await client.start_chain("t", max_attempts=2)
    async with Worker(client, {"t": handler}, mode="atomic", retry_backoff=lambda a: 0.0):
        done = await client.await_chain(chain.id, timeout=20)
    assert done.status == "failed"
    lines = await client.job_logs(chain.id)
    assert [(line.attempt, line.message) for line in lines] == [
        (1, "wrote the note"),
        (2, "wrote the note"),
    ]


@both_databases
async def test_lines_past_the_bound_are_counted_and_dropped_with_a_marker(
    client: Client,
) -> None:
    async def chatty(job: Job, ctx: JobContext) -> None:
        for n in range(25):
            ctx.log(f"line {n}")

    async def wide(job: Job, ctx: JobContext) -> None:
        for n in range(10):
            ctx.log("x" * 300, n=n)  # about 310 bytes each: three fit in 1,000

    few = await client.start_chain("chatty")
    big = await client.start_chain("wide")
    async with Worker(client, {"chatty": chatty}, job_log_lines=10):
        await client.await_chain(few.id, timeout=20)
    async with Worker(client, {"wide": wide}, job_log_bytes=1000):
        await client.await_chain(big.id, timeout=20)

    lines = await client.job_logs(few.id)
    assert [line.message for line in lines[:10]] == [f"line {n}" for n in range(10)]
    assert len(lines) == 11
    assert lines[-1].level == "WARNING"
    assert lines[-1].message.startswith("15 lines dropped")
    assert lines[-1].fields == {"dropped": 15}

    wide_lines = await client.job_logs(big.id)
    assert [line.fields for line in wide_lines[:-1]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert wide_lines[-1].message.startswith("7 lines dropped")


@both_databases
async def test_lines_of_a_running_job_are_written_before_it_ends(client: Client) -> None:
    release = asyncio.Event()

    async def slow(job: Job, ctx: JobContext) -> None:
        ctx.log("halfway")
        await release.wait()
        ctx.log("finished")

    chain = await client.start_chain("slow")
    async with Worker(client, {"slow": slow}):

        async def halfway_written() -> bool:
            return [line.message for line in await client.job_logs(chain.id)] == ["halfway"]

        await wait_until(halfway_written, timeout=20, interval=0.1)
        release.set()
        await client.await_chain(chain.id, timeout=20)
    messages = [line.message for line in await client.job_logs(chain.id)]
    assert messages == ["halfway", "finished"]
    assert not [t for t in other_tasks() if t.get_name() == "queuert-job-log-writer"]


@both_databases
async def test_retention_and_delete_chain_remove_the_lines(client: Client) -> None:
    async def logs(job: Job, ctx: JobContext) -> Any:
        ctx.log("first job")
        if job.type_name == "a":
            return ctx.continue_with("b")
        return None

    old = await client.start_chain("a")
    deleted = await client.start_chain("a")
    async with Worker(client, {"a": logs, "b": logs}):
        await client.await_chain(old.id, timeout=20)
        await client.await_chain(deleted.id, timeout=20)
    job_ids = [job.id for job in (await client.list_jobs(chain_id=old.id)).items]
    assert len(job_ids) == 2
    for job_id in job_ids:
        assert len(await client.job_logs(job_id)) == 1

    await client.delete_chain(deleted.id)
    assert await client.job_logs(deleted.id) == []
    assert await client.prune(older_than=timedelta(0)) == 1
    for job_id in job_ids:
        assert await client.job_logs(job_id) == []


@both_databases
async def test_a_sync_client_reads_the_lines_too(
    client: Client, sync_engine: Any, table_prefix: str
) -> None:
    from queuert_notify import SyncClient

    async def talk(job: Job, ctx: JobContext) -> None:
        ctx.log("one")
        ctx.log("two", n=2)

    chain = await client.start_chain("talk")
    async with Worker(client, {"talk": talk}):
        await client.await_chain(chain.id, timeout=20)

    def read() -> tuple[list[Any], list[Any]]:
        with SyncClient(sync_engine, table_prefix=table_prefix) as sync:
            return sync.job_logs(chain.id), sync.job_logs(chain.id, after=(1, 1))

    every, later = await asyncio.to_thread(read)
    assert [(line.seq, line.message, line.fields) for line in every] == [
        (1, "one", None),
        (2, "two", {"n": 2}),
    ]
    assert [line.message for line in later] == ["two"]


@every_driver
async def test_a_line_no_database_can_store_as_given_never_fails_the_completion(
    client: Client,
) -> None:
    async def odd(job: Job, ctx: JobContext) -> str:
        ctx.log("nul \x00 here", ratio=float("nan"))
        ctx.log("an object", when=object, text="nul \x00")
        return "completed"

    chain = await client.start_chain("odd")
    async with Worker(client, {"odd": odd}):
        done = await client.await_chain(chain.id, timeout=20)
    assert done.output == "completed"
    first, second = await client.job_logs(chain.id)
    assert first.message == "nul \ufffd here"
    assert first.fields == {"fields": "{'ratio': nan}"}
    assert second.fields == {"when": "<class 'object'>", "text": "nul \ufffd"}
