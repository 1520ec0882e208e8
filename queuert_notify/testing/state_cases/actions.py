"""State-adapter conformance: application-side actions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import (
    ChainInUseError,
    ChainNotFoundError,
    JobNotFoundError,
    JobOwnershipLostError,
)
from queuert_notify.testing.state_cases.support import (
    claim,
    claim_one,
    complete,
    start,
    token,
    total_jobs,
)
from state_adapters.model import Completion, ContinueWith, NewJob
from state_adapters.notifications import NotificationBuffer


class ActionsCases:
    """Application-side actions: cases every state adapter must pass."""

    async def test_cancelling_a_pending_chain(self, state: Any) -> None:
        started = await start(state)
        notes = NotificationBuffer()
        chain = await state.cancel_chain(started.id, notes=notes)
        assert chain.status == "cancelled" and chain.completed_at is not None
        assert notes.completed_chains == [started.id] and notes.lost_jobs == []
        assert await claim(state) == []

    async def test_cancelling_a_running_chain_takes_the_job_from_its_worker(
        self, state: Any
    ) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        assert (await state.cancel_chain(started.id, notes=notes)).status == "cancelled"
        assert notes.lost_jobs == [job.id] and notes.completed_chains == [started.id]
        (late,) = await state.complete_jobs(
            [Completion(job.id, token(job), output=1)], notes=NotificationBuffer()
        )
        assert isinstance(late, JobOwnershipLostError)
        assert (await state.get_chain(started.id)).status == "cancelled"

    async def test_cancelling_a_final_chain_changes_nothing(self, state: Any) -> None:
        started = await start(state)
        await complete(state, await claim_one(state), "done")
        notes = NotificationBuffer()
        chain = await state.cancel_chain(started.id, notes=notes)
        assert chain.status == "completed" and chain.output == "done" and len(notes) == 0

    async def test_trigger_makes_a_scheduled_job_due_now(self, state: Any) -> None:
        started = await start(state, run_at=datetime.now(UTC) + timedelta(hours=1))
        assert await claim(state) == []
        notes = NotificationBuffer()
        chain = await state.trigger_chain(started.id, notes=notes)
        assert chain.last_job.scheduled_at <= datetime.now(UTC)
        assert notes.scheduled == {"t": 1}
        assert (await claim_one(state)).id == started.id

    async def test_workerless_completion_completes_the_chain(self, state: Any) -> None:
        started = await start(state)
        notes = NotificationBuffer()
        chain = await state.complete_chain(started.id, {"approved": True}, notes=notes)
        assert chain.status == "completed" and chain.output == {"approved": True}
        assert notes.completed_chains == [started.id] and notes.lost_jobs == []
        assert await claim(state) == []

    async def test_workerless_completion_takes_a_running_job_from_its_worker(
        self, state: Any
    ) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        await state.complete_chain(started.id, "by hand", notes=notes)
        assert notes.lost_jobs == [job.id]
        with pytest.raises(JobOwnershipLostError):
            await state.renew_lease(job.id, token(job), 60)
        assert (await state.get_chain(started.id)).output == "by hand"

    async def test_unknown_ids_raise_typed_errors(self, state: Any) -> None:
        missing = "0" * 32
        notes = NotificationBuffer()
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(missing)
        with pytest.raises(JobNotFoundError):
            await state.get_job(missing)
        for action in (
            state.cancel_chain(missing, notes=notes),
            state.trigger_chain(missing, notes=notes),
            state.complete_chain(missing, None, notes=notes),
            state.delete_chain(missing),
        ):
            with pytest.raises(ChainNotFoundError):
                await action
        assert len(notes) == 0

    async def test_deleting_a_chain_removes_it_and_its_jobs(self, state: Any) -> None:
        started = await start(state, "first", dedup_key="k")
        job = await claim_one(state, ["first"])
        follow = ContinueWith(NewJob("second"))
        await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=follow)],
            notes=NotificationBuffer(),
        )
        await state.delete_chain(started.id)
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(started.id)
        assert await total_jobs(state) == 0
        again = await start(state, "first", dedup_key="k")
        assert again.deduplicated is False

    async def test_a_chain_others_are_blocked_on_cannot_be_deleted(self, state: Any) -> None:
        blocker = await start(state, "b")
        dependent = await start(state, "d", blockers=[blocker.id])
        with pytest.raises(ChainInUseError):
            await state.delete_chain(blocker.id)
        assert (await state.get_chain(blocker.id)).status == "pending"
        await state.delete_chain(dependent.id)
        await state.delete_chain(blocker.id)
        assert await total_jobs(state) == 0
