"""The stored rate window of a limited type: every start counted, in at most
``RATE_STEPS`` entries and the newest step however many claims there were, never
recorded before it happened (Postgres's function and SQLite's statements alike)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import JSON, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from state_adapters.steps.limited_claims import RATE_STEPS
from tests.support.queue_helpers import STATE_KINDS

pytest_plugins = ["tests.support.queue_fixtures"]
pytestmark = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)


async def test_the_window_keeps_every_start_in_few_entries(state: Any, engine: AsyncEngine) -> None:
    claims = 300
    # Every claim stays in the window: 300 one-by-one claims take seconds on a loaded
    # machine (6 s seen beside a parallel suite), far below a minute.
    window = 60.0
    await state.start_chains(
        [NewChain(NewJob("t")) for _ in range(claims)], notes=NotificationBuffer()
    )
    await state.set_limits(
        "t",
        concurrency=None,
        key_concurrency=None,
        rate=100_000,
        per_seconds=window,
        notes=NotificationBuffer(),
    )
    began = time.time()
    for _ in range(claims):
        assert len(await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=1)) == 1
    ended = time.time()
    controls = state.tables.type_controls
    async with engine.connect() as conn:
        row = (await conn.execute(select(controls))).one()
    starts = row.recent_starts
    assert sum(count for _, count in starts) == row.earlier_starts
    assert row.earlier_starts + row.step_starts == claims
    assert len(starts) <= min(claims, RATE_STEPS)
    instants = [instant for instant, _ in starts] + [row.step_at]
    assert instants == sorted(set(instants))
    # At the end of a step, never before the claim (clocks of one host; float slack).
    step = window / RATE_STEPS
    assert began - 1e-3 <= instants[0] and instants[-1] <= ended + step + 1e-3


async def test_a_window_stored_as_json_null_counts_as_no_starts(
    state: Any, engine: AsyncEngine
) -> None:
    # What set_limits wrote when a rate was lifted at revision 0005: JSON null,
    # not SQL NULL. A rate set later must read it as an empty window.
    await state.start_chains([NewChain(NewJob("t")) for _ in range(5)], notes=NotificationBuffer())
    await state.set_limits(
        "t", concurrency=None, key_concurrency=None, rate=2, per_seconds=60.0,
        notes=NotificationBuffer(),
    )  # fmt: skip
    controls = state.tables.type_controls
    async with engine.begin() as conn:
        await conn.execute(update(controls).values(recent_starts=JSON.NULL))
    assert len(await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=10)) == 2


async def _limit_rate(state: Any, rate: int, per: float) -> None:
    await state.set_limits(
        "t", concurrency=None, key_concurrency=None, rate=rate, per_seconds=per,
        notes=NotificationBuffer(),
    )  # fmt: skip


async def _claim(state: Any, limit: int) -> int:
    return len(await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=limit))


async def test_a_longer_per_counts_the_starts_the_shorter_window_forgot(state: Any) -> None:
    """3 per 2 s, used in full twice, then 4 per 10 s: the new window holds the 6 starts
    (the first 3 already dropped by the 2 s window), so no claim may start until they
    leave it. Every window of the new ``per`` then holds at most the larger of the new
    rate and what the old limits allowed in it (6 here, not 7)."""
    await state.start_chains([NewChain(NewJob("t")) for _ in range(20)], notes=NotificationBuffer())
    await _limit_rate(state, 3, 2.0)
    assert await _claim(state, 10) == 3
    # More than per + two steps: the first starts leave the stored window for good.
    await asyncio.sleep(2.0 + 3 * 2.0 / RATE_STEPS)
    assert await _claim(state, 10) == 3
    await _limit_rate(state, 4, 10.0)
    assert await _claim(state, 10) == 0
