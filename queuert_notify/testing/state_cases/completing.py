"""State-adapter conformance: completing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import (
    InvalidInputError,
    JobOwnershipLostError,
)
from queuert_notify.testing.state_cases.support import (
    claim,
    claim_one,
    complete,
    start,
    token,
)
from state_adapters.model import Completion, ContinueWith, JobRecord, NewJob
from state_adapters.notifications import NotificationBuffer


class CompletingCases:
    """Completing: cases every state adapter must pass."""

    async def test_completing_the_last_job_completes_the_chain(self, state: Any) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        (done,) = await state.complete_jobs(
            [Completion(job.id, token(job), output={"sent": True})], notes=notes
        )
        assert isinstance(done, JobRecord) and done.status == "completed"
        assert done.output == {"sent": True} and done.completed_at is not None
        chain = await state.get_chain(started.id)
        assert chain.status == "completed" and chain.output == {"sent": True}
        assert chain.completed_at is not None
        assert notes.completed_chains == [started.id]

    async def test_continue_with_creates_the_next_job_of_the_chain(self, state: Any) -> None:
        started = await start(state, "first", {"n": 1})
        job = await claim_one(state, ["first"])
        notes = NotificationBuffer()
        follow = ContinueWith(NewJob("second", {"n": 2}, priority=3))
        (done,) = await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=follow)], notes=notes
        )
        assert isinstance(done, JobRecord) and done.status == "completed"
        chain = await state.get_chain(started.id)
        assert chain.status == "pending" and chain.type_name == "first"
        assert chain.last_job.type_name == "second" and chain.last_job.chain_index == 1
        assert chain.last_job.input == {"n": 2} and chain.last_job.priority == 3
        assert notes.scheduled == {"second": 1} and notes.completed_chains == []
        second = await claim_one(state, ["second"])
        assert second.chain_id == started.id
        await complete(state, second, "end")
        chain = await state.get_chain(started.id)
        assert chain.status == "completed" and chain.output == "end"
        page = await state.list_jobs(chain_id=started.id)
        assert [j.chain_index for j in page.items] == [0, 1]

    async def test_a_batch_schedules_each_next_job_at_its_own_run_at(self, state: Any) -> None:
        # A completion's statement may leave out the time of a next job due now
        # (Postgres does).
        for n in range(4):
            await start(state, "first", n)
        jobs = await claim(state, ["first"], limit=4)
        now = datetime.now(UTC)
        run_ats = [None, now - timedelta(hours=1), now + timedelta(hours=1), None]
        nexts = [
            NewJob("second", n, run_at=r, max_attempts=n or None, trace_context=f"tc{n}")
            for n, r in enumerate(run_ats)
        ]
        await state.complete_jobs(
            [Completion(j.id, token(j), continue_with=ContinueWith(nexts[j.input])) for j in jobs],
            notes=NotificationBuffer(),
        )
        page = await state.list_jobs(type_name="second")
        second = {j.input: j for j in page.items}
        assert [second[n].max_attempts for n in range(4)] == [None, 1, 2, 3]
        assert [second[n].trace_context for n in range(4)] == ["tc0", "tc1", "tc2", "tc3"]
        assert second[2].scheduled_at == now + timedelta(hours=1)
        due = [second[0], second[1], second[3]]
        assert all(now - timedelta(seconds=1) <= j.scheduled_at == j.created_at for j in due)
        assert {j.id for j in await claim(state, ["second"], limit=10)} == {j.id for j in due}

    async def test_a_stale_completion_changes_nothing_and_others_in_the_batch_apply(
        self, state: Any
    ) -> None:
        await start(state, input=1)
        await start(state, input=2)
        a, b = await claim(state, limit=2)
        notes = NotificationBuffer()
        results = await state.complete_jobs(
            [
                Completion(a.id, "0" * 32, output="stale"),
                Completion(b.id, token(b), output="fresh"),
            ],
            notes=notes,
        )
        assert isinstance(results[0], JobOwnershipLostError)
        assert isinstance(results[1], JobRecord) and results[1].output == "fresh"
        untouched = await state.get_job(a.id)
        assert untouched.status == "running" and untouched.output is None
        assert notes.completed_chains == [b.chain_id]

    async def test_a_job_completed_twice_in_one_batch_completes_once(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state)
        results = await state.complete_jobs(
            [
                Completion(job.id, token(job), output=1),
                Completion(job.id, token(job), output=2),
            ],
            notes=NotificationBuffer(),
        )
        assert isinstance(results[0], JobRecord) and results[0].output == 1
        assert isinstance(results[1], JobOwnershipLostError)
        assert (await state.get_job(job.id)).output == 1

    async def test_output_that_is_not_strict_json_is_rejected_before_any_write(
        self, state: Any
    ) -> None:
        await start(state)
        job = await claim_one(state)
        with pytest.raises(InvalidInputError):
            await state.complete_jobs(
                [Completion(job.id, token(job), output=float("nan"))],
                notes=NotificationBuffer(),
            )
        assert (await state.get_job(job.id)).status == "running"
