"""A notify server that keeps failing costs a few log lines per outage, not a traceback
per call."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import ChainSpec, Client, RedisNotifyAdapter, Worker
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.outage_log import WARNING_INTERVAL, OutageLog
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
