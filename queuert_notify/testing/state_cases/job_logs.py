"""State-adapter conformance: the lines jobs log (``append_job_logs``, a completion's
``log_lines``, ``job_logs``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import InvalidInputError, JobOwnershipLostError
from queuert_notify.testing.state_cases.support import claim_one, start, token
from state_adapters.model import Completion, JobLogLine
from state_adapters.notifications import NotificationBuffer


def _line(job_id: str, attempt: int, seq: int, message: str, **fields: Any) -> JobLogLine:
    return JobLogLine(job_id, attempt, seq, datetime.now(UTC), "INFO", message, fields or None)


class JobLogsCases:
    """Job logs: cases every state adapter must pass."""

    async def test_lines_written_alone_and_with_the_completion_read_in_order(
        self, state: Any
    ) -> None:
        started = await start(state)
        job = await claim_one(state)
        # Written out of order on purpose: a batch in flight may commit after a later one.
        await state.append_job_logs([_line(job.id, 1, 2, "second", n=2)])
        await state.append_job_logs([_line(job.id, 1, 1, "first")])
        completion = Completion(job.id, token(job), log_lines=[_line(job.id, 1, 3, "last")])
        (done,) = await state.complete_jobs([completion], notes=NotificationBuffer())
        assert not isinstance(done, JobOwnershipLostError)
        lines = await state.job_logs(started.id)
        assert [(line.seq, line.message, line.fields) for line in lines] == [
            (1, "first", None),
            (2, "second", {"n": 2}),
            (3, "last", None),
        ]
        assert lines[0].at.tzinfo is not None and lines[0].level == "INFO"
        later = await state.job_logs(started.id, after=(1, 1))
        assert [line.seq for line in later] == [2, 3]
        assert await state.job_logs("no-such-job") == []

    async def test_a_completion_refused_for_a_stale_token_writes_no_lines(self, state: Any) -> None:
        started = await start(state)
        job = await claim_one(state)
        stale = Completion(job.id, "stale-token", log_lines=[_line(job.id, 1, 1, "lost")])
        (refused,) = await state.complete_jobs([stale], notes=NotificationBuffer())
        assert isinstance(refused, JobOwnershipLostError)
        assert await state.job_logs(started.id) == []

    async def test_retention_deletes_a_chains_lines(self, state: Any) -> None:
        started = await start(state)
        job = await claim_one(state)
        done = Completion(job.id, token(job), log_lines=[_line(job.id, 1, 1, "done")])
        await state.complete_jobs([done], notes=NotificationBuffer())
        assert len(await state.job_logs(started.id)) == 1
        assert await state.prune_chains(datetime.now(UTC) + timedelta(seconds=1)) == 1
        assert await state.job_logs(started.id) == []

    async def test_a_position_that_is_not_attempt_and_seq_is_refused(self, state: Any) -> None:
        with pytest.raises(InvalidInputError):
            await state.job_logs("some-job", after=3)
