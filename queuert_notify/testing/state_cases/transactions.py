"""State-adapter conformance: transactional enqueue."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from queuert_notify.errors import (
    ChainNotFoundError,
)
from queuert_notify.testing.state_cases.support import (
    claim_one,
    complete,
    engine_of,
    start,
    token,
)
from state_adapters.model import Completion, NewChain, NewJob, StartedChain
from state_adapters.notifications import NotificationBuffer


class TransactionsCases:
    """Transactional enqueue: cases every state adapter must pass."""

    async def test_a_chain_started_in_a_session_exists_only_once_the_session_commits(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session:
            async with session.begin():
                started = await start_in(state, session)
                assert (await state.get_chain(started.id, session=session)).status == "pending"
            assert (await state.get_chain(started.id)).status == "pending"
            async with session.begin():
                rolled_back = await start_in(state, session)
                await session.rollback()
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(rolled_back.id)

    async def test_writes_through_a_connection_join_its_transaction(self, state: Any) -> None:
        engine = engine_of(state)
        async with engine.connect() as connection:
            async with connection.begin():
                kept = await start_in(state, connection)
            transaction = await connection.begin()
            dropped = await start_in(state, connection)
            await transaction.rollback()
        assert (await state.get_chain(kept.id)).status == "pending"
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(dropped.id)

    async def test_a_completion_in_a_rolled_back_session_leaves_the_lease(self, state: Any) -> None:
        engine = engine_of(state)
        started = await start(state)
        job = await claim_one(state)
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(job.id, token(job), output="x")],
                notes=NotificationBuffer(),
                session=session,
            )
            await session.rollback()
        assert (await state.get_chain(started.id)).status == "running"
        assert (await complete(state, job, "y")).output == "y"


async def start_in(state: Any, session: Any, type_name: str = "t") -> StartedChain:
    started: StartedChain
    (started,) = await state.start_chains(
        [NewChain(NewJob(type_name))], notes=NotificationBuffer(), session=session
    )
    return started
