"""State-adapter conformance: deduplication."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from queuert_notify.testing.state_cases.support import (
    claim_one,
    complete,
    engine_of,
    start,
    total_jobs,
)
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer


class DeduplicationCases:
    """Deduplication: cases every state adapter must pass."""

    async def test_a_dedup_key_returns_the_existing_incomplete_chain(self, state: Any) -> None:
        first = await start(state, dedup_key="k")
        notes = NotificationBuffer()
        (again,) = await state.start_chains(
            [NewChain(NewJob("t", "other input"), dedup_key="k")], notes=notes
        )
        assert again.id == first.id and again.deduplicated is True
        assert notes.scheduled == {}
        other_type = await start(state, "u", dedup_key="k")
        assert other_type.id != first.id and other_type.deduplicated is False
        assert await total_jobs(state) == 2

    async def test_a_dedup_key_is_free_again_once_its_chain_completed(self, state: Any) -> None:
        first = await start(state, dedup_key="k")
        await complete(state, await claim_one(state))
        second = await start(state, dedup_key="k")
        assert second.id != first.id and second.deduplicated is False
        third = await start(state, dedup_key="k")
        assert third.id == second.id and third.deduplicated is True

    async def test_dedup_scope_ever_returns_a_completed_chain(self, state: Any) -> None:
        first = await start(state, dedup_key="k", dedup_scope="ever")
        await complete(state, await claim_one(state))
        again = await start(state, dedup_key="k", dedup_scope="ever")
        assert again.id == first.id and again.deduplicated is True

    async def test_a_dedup_window_limits_how_long_a_key_deduplicates(self, state: Any) -> None:
        # A window wide enough that a loaded machine still starts `inside` within it.
        first = await start(state, dedup_key="k", dedup_window=3.0)
        inside = await start(state, dedup_key="k", dedup_window=3.0)
        assert inside.id == first.id and inside.deduplicated is True
        await asyncio.sleep(3.1)
        after = await start(state, dedup_key="k", dedup_window=3.0)
        assert after.id != first.id and after.deduplicated is False

    async def test_duplicates_within_one_batch_make_one_chain(self, state: Any) -> None:
        started = await state.start_chains(
            [NewChain(NewJob("t", n), dedup_key="k") for n in range(3)],
            notes=NotificationBuffer(),
        )
        assert len({s.id for s in started}) == 1
        assert [s.deduplicated for s in started] == [False, True, True]
        assert await total_jobs(state) == 1

    async def test_three_concurrent_starts_with_one_key_make_one_chain(self, state: Any) -> None:
        results = await asyncio.gather(*(start(state, input=n, dedup_key="k") for n in range(3)))
        assert len({r.id for r in results}) == 1
        assert sorted(r.deduplicated for r in results) == [False, True, True]
        assert await total_jobs(state) == 1

    async def test_a_start_waiting_on_an_uncommitted_key_gets_that_chain_once_committed(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session, session.begin():
            (held,) = await state.start_chains(
                [NewChain(NewJob("t"), dedup_key="k")],
                notes=NotificationBuffer(),
                session=session,
            )
            waiting = asyncio.ensure_future(start(state, dedup_key="k"))
            await asyncio.sleep(0.3)
        again = await waiting
        assert again.id == held.id and again.deduplicated is True
        assert await total_jobs(state) == 1

    async def test_a_start_waiting_on_a_key_whose_holder_rolls_back_takes_the_key(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session, session.begin():
            (held,) = await state.start_chains(
                [NewChain(NewJob("t"), dedup_key="k")],
                notes=NotificationBuffer(),
                session=session,
            )
            waiting = asyncio.ensure_future(start(state, dedup_key="k"))
            await asyncio.sleep(0.3)
            await session.rollback()
        mine = await waiting
        assert mine.id != held.id and mine.deduplicated is False
        assert (await state.get_chain(mine.id)).status == "pending"
