"""State-adapter conformance: failing and retrying."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import InvalidInputError, JobOwnershipLostError
from queuert_notify.testing.state_cases.support import (
    claim,
    claim_one,
    start,
)
from state_adapters.notifications import NotificationBuffer


class RetryingCases:
    """Failing and retrying: cases every state adapter must pass."""

    async def test_a_failed_attempt_returns_to_pending_after_the_retry_delay(
        self, state: Any
    ) -> None:
        await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        before = datetime.now(UTC)
        outcome = await state.fail_job(job.id, job.lease_token, "boom", notes=notes, retry_delay=60)
        assert outcome.status == "pending" and outcome.retry_at is not None
        assert before + timedelta(seconds=59) <= outcome.retry_at
        stored = await state.get_job(job.id)
        assert stored.status == "pending" and stored.last_error == "boom"
        assert stored.scheduled_at == outcome.retry_at
        assert await claim(state) == []
        assert notes.scheduled == {"t": 1}
        with pytest.raises(JobOwnershipLostError):
            await state.fail_job(job.id, job.lease_token, "again", notes=notes)

    async def test_retries_count_attempts_and_back_off(self, state: Any) -> None:
        started = await start(state)
        waits = []
        for attempt in (1, 2, 3):
            job = await claim_one(state)
            assert job.attempt == attempt
            before = datetime.now(UTC)
            outcome = await state.fail_job(
                job.id, job.lease_token, f"fail {attempt}", notes=NotificationBuffer()
            )
            assert outcome.status == "pending" and outcome.retry_at is not None
            waits.append((outcome.retry_at - before).total_seconds())
            await state.trigger_chain(started.id, notes=NotificationBuffer())
        assert waits[0] >= 0 and waits[2] >= waits[0]

    async def test_exhausted_attempts_fail_the_job_and_the_chain(self, state: Any) -> None:
        started = await start(state, max_attempts=2)
        for _ in range(2):
            job = await claim_one(state)
            notes = NotificationBuffer()
            outcome = await state.fail_job(
                job.id, job.lease_token, "boom", notes=notes, retry_delay=0
            )
        assert outcome.status == "failed" and outcome.retry_at is None
        assert notes.completed_chains == [started.id]
        chain = await state.get_chain(started.id)
        assert chain.status == "failed" and chain.completed_at is not None
        assert chain.last_job.attempt == 2 and chain.last_job.last_error == "boom"
        assert await claim(state) == []

    async def test_a_final_failure_fails_the_chain_whatever_attempts_are_left(
        self, state: Any
    ) -> None:
        started = await start(state, max_attempts=5)
        job = await claim_one(state)
        notes = NotificationBuffer()
        outcome = await state.fail_job(job.id, job.lease_token, "misuse", notes=notes, final=True)
        assert outcome.status == "failed"
        assert (await state.get_chain(started.id)).status == "failed"
        assert notes.completed_chains == [started.id]

    async def test_retry_chain_runs_a_failed_chain_again_with_fresh_attempts(
        self, state: Any
    ) -> None:
        started = await start(state, max_attempts=1)
        job = await claim_one(state)
        await state.fail_job(job.id, job.lease_token, "boom", notes=NotificationBuffer())
        notes = NotificationBuffer()
        chain = await state.retry_chain(started.id, notes=notes)
        assert chain.status == "pending" and chain.completed_at is None
        assert notes.scheduled == {"t": 1}
        again = await claim_one(state)
        assert (again.id, again.attempt) == (job.id, 1)
        with pytest.raises(InvalidInputError):
            await state.retry_chain(started.id, notes=NotificationBuffer())
