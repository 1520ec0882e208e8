"""A notify server that keeps failing costs a few log lines per outage, not a traceback
per call."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import ChainSpec, Client, InProcessNotifyAdapter, RedisNotifyAdapter, Worker
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.outage_log import WARNING_INTERVAL, OutageLog
from tests.support.queue_helpers import drop_tables, wait_until
from tests.support.services import OwnServer


def test_an_outage_is_warned_about_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    log = OutageLog(logging.getLogger("test.outage"), "calling the thing")
    with caplog.at_level(logging.DEBUG, logger="test.outage"):
        for _ in range(50):
            try:
                raise ConnectionError("down")
            except ConnectionError:
                log.failed("carrying on")
        log.succeeded()
        log.succeeded()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is not None
    assert "calling the thing failed; carrying on" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "calling the thing works again"
    ]


async def test_a_worker_whose_wake_budget_is_unreachable_warns_once_per_outage(
    private_redis: OwnServer, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    done = asyncio.Event()
    ran = 0

    async def handler(job: Any, ctx: Any) -> None:
        nonlocal ran
        ran += 1
        if ran == 40:
            done.set()

    try:
        async with Client(
            state=state, notify=RedisNotifyAdapter(url=private_redis.url, prefix=prefix)
        ) as client:
            await client.start_chains([ChainSpec(type_name="t") for _ in range(40)])
            private_redis.kill()
            # One slot: every freed slot asks the (unreachable) wake budget before
            # claiming again, so each of the 40 jobs costs a failed consume_wake_hint.
            with caplog.at_level(logging.INFO):
                began = time.monotonic()
                async with Worker(client, handlers={"t": handler}, concurrency=1):
                    await asyncio.wait_for(done.wait(), 60)
                took = time.monotonic() - began
    finally:
        await engine.dispose()
    warned = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "consume_wake_hint" in r.getMessage()
    ]
    # One warning, then at most one per WARNING_INTERVAL however long the drain took.
    assert 1 <= len(warned) <= 1 + took // WARNING_INTERVAL, (took, [r.msg for r in warned])


async def test_a_worker_whose_claims_keep_failing_logs_one_line_per_outage_and_one_when_it_ends(
    postgres_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Claims wait at most 50 ms for a lock: while the test holds the jobs table, every
    # pass of the worker's loop fails, at once and again and again.
    engine = create_async_engine(postgres_url, connect_args={"options": "-c lock_timeout=50"})
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()

    def loop_records(level: int | None = None) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name == "queuert_notify.worker.worker"
            and level in (None, r.levelno)
            and r.getMessage().startswith("worker loop")
        ]

    async def handler(job: Any, ctx: Any) -> None:
        return None

    try:
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            caplog.set_level(logging.DEBUG, logger="queuert_notify.worker")
            async with Worker(client, handlers={"t": handler}, poll_interval=0.05):
                async with create_async_engine(postgres_url).connect() as locker:
                    await locker.execute(text(f"LOCK TABLE {prefix}_jobs IN ACCESS EXCLUSIVE MODE"))
                    # Every failed pass is logged (at DEBUG): wait for a dozen of them.
                    await wait_until(lambda: len(loop_records()) >= 12, timeout=60)
                    await locker.rollback()
                await wait_until(lambda: loop_records(logging.INFO), timeout=60)
                chain = await client.start_chain("t")
                assert (await client.await_chain(chain.id, timeout=30)).status == "completed"
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
    (warning,) = loop_records(logging.WARNING)
    # One line that says what failed, no traceback (tracebacks are at DEBUG).
    assert not warning.exc_info and "retrying" in warning.getMessage(), warning.getMessage()
    assert "LockNotAvailable" in warning.getMessage(), warning.getMessage()
    assert [r.getMessage() for r in loop_records(logging.INFO)] == ["worker loop works again"]
    assert any(r.exc_info for r in loop_records(logging.DEBUG))
