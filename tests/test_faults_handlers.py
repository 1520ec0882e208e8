"""Handlers that misbehave: an SQL error in the handler's own session, a handler that
never returns, a handler that blocks the event loop. The job is retried or reported,
and the queue keeps running."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.loop_watchdog import LoopWatchdog
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import STATE_KINDS, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]


@pytest.fixture
async def ledger(engine: AsyncEngine, table_prefix: str) -> AsyncIterator[Table]:
    """An application table the handlers write through ``ctx.session``."""
    table = Table(
        f"{table_prefix}app_ledger",
        MetaData(),
        Column("job_id", String(64)),
        Column("attempt", Integer),
    )
    async with engine.begin() as conn:
        await conn.run_sync(table.create)
    yield table  # dropped with the test's other prefixed tables


async def _ledger_rows(engine: AsyncEngine, ledger: Table) -> list[tuple[str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(ledger.c.job_id, ledger.c.attempt))
        return [(job_id, attempt) for job_id, attempt in rows]


def _kinds(events: list[WorkerEvent], job_id: str) -> list[str]:
    return [e.kind for e in events if e.job_id == job_id]


# -- an SQL error inside the handler's session (atomic mode) ------------------------------


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
async def test_sql_error_in_the_handlers_session_retries_the_job_and_rolls_back_its_writes(
    client: Client, engine: AsyncEngine, ledger: Table
) -> None:
    events: list[WorkerEvent] = []
    rows_after_failed_attempt: list[list[tuple[str, int]]] = []

    async def post(job: Job, ctx: JobContext) -> str:
        await ctx.session.execute(insert(ledger).values(job_id=job.id, attempt=job.attempt))
        if job.attempt == 1:
            await ctx.session.execute(text("SELECT no_such_column FROM no_such_table"))
        return "posted"

    async def ping(job: Job, ctx: JobContext) -> str:
        return "pong"

    def on_event(event: WorkerEvent) -> None:
        events.append(event)
        if event.kind == "retried":
            # Recorded after the rollback and before the retry may start (backoff 0.3 s).
            check = asyncio.create_task(_ledger_rows(engine, ledger))
            check.add_done_callback(lambda t: rows_after_failed_attempt.append(t.result()))

    chain = await client.start_chain("post")
    async with Worker(
        client,
        {"post": post, "ping": ping},
        mode="atomic",
        retry_backoff=lambda attempt: 0.3,
        on_event=on_event,
    ):
        done = await client.await_chain(chain.id, timeout=10)
        # The queue keeps running: the next job is picked up as usual.
        after = await client.start_chain("ping")
        assert (await client.await_chain(after.id, timeout=5)).output == "pong"
    assert rows_after_failed_attempt == [[]]
    assert done.status == "completed"
    assert done.output == "posted"
    assert done.last_job.attempt == 2
    assert await _ledger_rows(engine, ledger) == [(chain.id, 2)]
    assert _kinds(events, chain.id) == ["started", "retried", "started", "completed"]
    retried = next(e for e in events if e.kind == "retried")
    assert "no_such_table" in (retried.error or "")


# Postgres only: there a failed statement aborts the whole transaction, so the completion
# cannot commit either. (SQLite keeps the transaction usable after a failed statement.)
@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
async def test_a_swallowed_sql_error_still_fails_the_attempt_its_transaction_aborted(
    client: Client, engine: AsyncEngine, ledger: Table
) -> None:
    events: list[WorkerEvent] = []

    async def post(job: Job, ctx: JobContext) -> str:
        await ctx.session.execute(insert(ledger).values(job_id=job.id, attempt=job.attempt))
        if job.attempt == 1:
            # The handler carries on as if nothing happened.
            with contextlib.suppress(DBAPIError):
                await ctx.session.execute(text("SELECT no_such_column FROM no_such_table"))
        return "posted"

    chain = await client.start_chain("post")
    async with Worker(
        client, {"post": post}, retry_backoff=lambda attempt: 0.05, on_event=events.append
    ):
        done = await client.await_chain(chain.id, timeout=10)
    assert (done.status, done.output, done.last_job.attempt) == ("completed", "posted", 2)
    assert await _ledger_rows(engine, ledger) == [(chain.id, 2)]
    assert _kinds(events, chain.id) == ["started", "retried", "started", "completed"]


# -- a handler that never returns -----------------------------------------------------------


@pytest.mark.parametrize("heartbeats", [True, False], ids=["heartbeats", "silent"])
async def test_a_handler_that_never_returns_keeps_its_lease_until_the_timeout_retries_it(
    client: Client, heartbeats: bool
) -> None:
    # The first attempt outlives two lease lengths. The lease outlasts a stall of a
    # loaded machine: the reaping worker runs in the same event loop, and after a stall
    # longer than two thirds of a lease it may look before the renewal is sent.
    lease, timeout = 3.0, 7.0
    events: list[WorkerEvent] = []
    first_attempt: dict[str, float] = {}

    async def hang(job: Job, ctx: JobContext) -> str:
        if job.attempt > 1:
            return f"attempt {job.attempt}"
        first_attempt["start"] = time.monotonic()
        try:
            while True:
                if heartbeats:
                    await ctx.heartbeat()
                await asyncio.sleep(0.05)
        finally:
            first_attempt["end"] = time.monotonic()

    options: dict[str, Any] = {
        "lease": lease,
        "handler_timeout": timeout,
        "retry_backoff": lambda attempt: 0.05,
        "on_event": events.append,
    }
    chain = await client.start_chain("hang")
    async with (
        Worker(client, {"hang": hang}, **options),
        # A second worker reaping every 50 ms: while the first keeps its lease alive it
        # must find nothing expired.
        Worker(client, {"hang": hang}, reap_interval=0.05, poll_interval=0.1, **options),
    ):
        done = await client.await_chain(chain.id, timeout=30)
    assert (done.status, done.output) == ("completed", "attempt 2")
    assert "reaped" not in [e.kind for e in events]
    assert _kinds(events, chain.id) == ["started", "retried", "started", "completed"]
    assert first_attempt["end"] - first_attempt["start"] >= timeout - 0.05
    retried = next(e for e in events if e.kind == "retried")
    assert retried.error == f"handler timed out after {timeout}s"


# -- a handler that blocks the event loop ---------------------------------------------------


async def test_a_handler_blocking_the_event_loop_is_logged_with_its_job_id(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[WorkerEvent] = []

    async def blocking(job: Job, ctx: JobContext) -> str:
        time.sleep(0.8)  # noqa: ASYNC251  # the mistake under test
        return "done, eventually"

    caplog.set_level(logging.WARNING, logger="queuert_notify.worker.worker")
    chain = await client.start_chain("blocking")
    async with Worker(
        client, {"blocking": blocking}, loop_lag_threshold=0.3, on_event=events.append
    ):
        done = await client.await_chain(chain.id, timeout=10)
        await wait_until(lambda: any(e.kind == "loop_blocked" for e in events), timeout=10)
    assert done.output == "done, eventually"
    # A loaded machine may stall the loop on its own as well (0.7 s was seen in CI):
    # such reports name no job, or not this one alone.
    (warning,) = [
        r
        for r in caplog.records
        if r.getMessage().startswith("event loop blocked")
        and getattr(r, "job_ids", None) == [chain.id]
    ]
    assert warning.levelno == logging.WARNING
    assert chain.id in warning.getMessage()
    assert "asyncio.to_thread" in warning.getMessage()
    (blocked,) = [e for e in events if e.kind == "loop_blocked" and e.job_ids == (chain.id,)]
    assert blocked.lag is not None and 0.3 < blocked.lag <= 0.8 + 2.0


async def test_loop_watchdog_reports_late_wakeups_only() -> None:
    reports: list[tuple[float, frozenset[str]]] = []
    # The threshold is above the stalls a loaded machine causes by itself (2 s).
    watchdog = LoopWatchdog(
        2.5, on_lag=lambda lag, active: reports.append((lag, active)), active=lambda: ["job-1"]
    )
    watchdog.start()
    try:
        await asyncio.sleep(1.0)  # the loop is free: the watchdog wakes on time
        assert reports == []
        time.sleep(3.5)  # noqa: ASYNC251  # blocks the loop
        await wait_until(lambda: reports, timeout=10)
    finally:
        await watchdog.close()
    ((lag, active),) = reports
    assert 2.5 < lag < 3.5 + 2.0  # a wakeup due before the block is later still
    assert active == {"job-1"}
    assert watchdog._task is None
