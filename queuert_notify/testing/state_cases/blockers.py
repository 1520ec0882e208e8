"""State-adapter conformance: blockers."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from queuert_notify.testing.state_cases.support import (
    claim,
    claim_one,
    complete,
    engine_of,
    start,
    token,
)
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer


class BlockersCases:
    """Blockers: cases every state adapter must pass."""

    async def test_a_blocked_job_waits_for_every_blocker_chain(self, state: Any) -> None:
        first = await start(state, "b", 1)
        second = await start(state, "b", 2)
        notes = NotificationBuffer()
        (dependent,) = await state.start_chains(
            [NewChain(NewJob("d"), blockers=[first.id, second.id])], notes=notes
        )
        assert notes.scheduled == {}
        assert (await state.get_chain(dependent.id)).status == "blocked"
        assert await claim(state, ["d"]) == []
        assert await state.next_due_at(["d"]) is None
        await complete(state, await claim_one(state, ["b"]))
        assert (await state.get_chain(dependent.id)).status == "blocked"
        job = await claim_one(state, ["b"])
        notes = NotificationBuffer()
        await state.complete_jobs([Completion(job.id, token(job))], notes=notes)
        assert notes.scheduled == {"d": 1}
        assert (await state.get_chain(dependent.id)).status == "pending"
        assert (await claim_one(state, ["d"])).id == dependent.id

    async def test_a_final_blocker_does_not_hold_a_new_job_back(self, state: Any) -> None:
        done = await start(state, "b")
        await complete(state, await claim_one(state, ["b"]))
        failed = await start(state, "b", max_attempts=1)
        job = await claim_one(state, ["b"])
        await state.fail_job(job.id, job.lease_token, "x", notes=NotificationBuffer())
        dependent = await start(state, "d", blockers=[done.id, failed.id])
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_cancelled_or_failed_blocker_releases_its_dependents(self, state: Any) -> None:
        blocker = await start(state, "b")
        dependent = await start(state, "d", blockers=[blocker.id])
        notes = NotificationBuffer()
        await state.cancel_chain(blocker.id, notes=notes)
        assert notes.scheduled == {"d": 1}
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_blocker_completing_while_a_dependent_is_added_never_strands_it(
        self, state: Any
    ) -> None:
        for _ in range(8):
            blocker = await start(state, "b")
            job = await claim_one(state, ["b"])
            dependent, _ = await asyncio.gather(
                start(state, "d", blockers=[blocker.id]), complete(state, job)
            )
            assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_dependent_added_in_an_open_transaction_is_released_by_its_blocker(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        blocker = await start(state, "b")
        job = await claim_one(state, ["b"])
        async with AsyncSession(engine) as session, session.begin():
            (dependent,) = await state.start_chains(
                [NewChain(NewJob("d"), blockers=[blocker.id])],
                notes=NotificationBuffer(),
                session=session,
            )
            completing = asyncio.ensure_future(complete(state, job))
            # The completer now waits for this transaction (row lock or write lock).
            await asyncio.sleep(0.3)
        await completing
        assert (await state.get_chain(dependent.id)).status == "pending"
        assert (await claim_one(state, ["d"])).id == dependent.id

    async def test_a_dependent_added_while_its_blocker_completes_sees_it_complete(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        blocker = await start(state, "b")
        job = await claim_one(state, ["b"])
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(job.id, token(job))],
                notes=NotificationBuffer(),
                session=session,
            )
            starting = asyncio.ensure_future(start(state, "d", blockers=[blocker.id]))
            await asyncio.sleep(0.3)
        dependent = await starting
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_two_blockers_completing_at_once_release_their_dependent(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        first, second = await start(state, "b"), await start(state, "b")
        dependent = await start(state, "d", blockers=[first.id, second.id])
        a, b = await claim(state, ["b"], limit=2)
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(a.id, token(a))], notes=NotificationBuffer(), session=session
            )
            other = asyncio.ensure_future(complete(state, b))
            await asyncio.sleep(0.3)
        await other
        assert (await state.get_chain(dependent.id)).status == "pending"
