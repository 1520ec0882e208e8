"""State-adapter conformance: the ticks of periodic schedules."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.testing.state_cases.support import claim_one, complete, total_jobs
from state_adapters.errors import InvalidInputError
from state_adapters.model import NewChain, NewJob, StartedChain
from state_adapters.notifications import NotificationBuffer

TICK = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def _chain(tick: datetime) -> NewChain:
    return NewChain(
        NewJob("t", {"tick": tick.isoformat()}),
        dedup_key=f"schedule:s@{tick.isoformat()}",
        dedup_scope="ever",
    )


async def _take(state: Any, tick: datetime, *, chain: bool = True) -> StartedChain | None:
    started: StartedChain | None = await state.take_schedule_tick(
        "s", tick, _chain(tick) if chain else None, notes=NotificationBuffer()
    )
    return started


class ScheduleCases:
    """Schedule ticks: cases every state adapter must pass."""

    async def test_one_caller_of_many_takes_a_tick_and_starts_its_chain(self, state: Any) -> None:
        taken = await asyncio.gather(*(_take(state, TICK) for _ in range(8)))
        started = [t for t in taken if t is not None]
        assert len(started) == 1 and await total_jobs(state) == 1
        assert (await state.get_chain(started[0].id)).last_job.input == {"tick": TICK.isoformat()}
        assert await state.schedule_ticks(["s", "other"]) == {"s": TICK}

    async def test_a_tick_at_or_before_the_last_one_is_never_taken(self, state: Any) -> None:
        assert await _take(state, TICK) is not None
        assert await _take(state, TICK) is None
        assert await _take(state, TICK - timedelta(hours=1)) is None
        assert await _take(state, TICK + timedelta(hours=1)) is not None
        assert await total_jobs(state) == 2

    async def test_registering_a_schedule_records_its_tick_and_starts_nothing(
        self, state: Any
    ) -> None:
        assert await _take(state, TICK, chain=False) is None
        assert await state.schedule_ticks(["s"]) == {"s": TICK}
        # Registering again never moves the tick (that would skip a due run).
        await _take(state, TICK + timedelta(hours=1), chain=False)
        assert await state.schedule_ticks(["s"]) == {"s": TICK}
        assert await total_jobs(state) == 0

    async def test_a_tick_whose_chain_was_pruned_is_not_taken_again(self, state: Any) -> None:
        assert await _take(state, TICK) is not None
        await complete(state, await claim_one(state))
        assert await state.prune_chains(datetime.now(UTC) + timedelta(seconds=1)) == 1
        assert await _take(state, TICK) is None
        assert await total_jobs(state) == 0

    async def test_a_bad_schedule_name_or_a_naive_tick_is_refused(self, state: Any) -> None:
        with pytest.raises(InvalidInputError):
            await state.take_schedule_tick("", TICK, None, notes=NotificationBuffer())
        with pytest.raises(InvalidInputError):
            await state.take_schedule_tick(
                "s", TICK.replace(tzinfo=None), None, notes=NotificationBuffer()
            )

    async def test_database_time_is_an_aware_instant_that_never_goes_back(self, state: Any) -> None:
        # What ticks fall due by: the database's clock, as an aware UTC instant.
        first = await state.database_time()
        await asyncio.sleep(0.01)
        second = await state.database_time()
        assert first.utcoffset() == timedelta(0) and second.utcoffset() == timedelta(0)
        assert first < second
