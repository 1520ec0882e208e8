"""State-adapter conformance: acquiring."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from queuert_notify.testing.state_cases.support import (
    claim,
    claim_one,
    start,
)


class AcquiringCases:
    """Acquiring: cases every state adapter must pass."""

    async def test_acquire_marks_the_job_running_under_a_fresh_lease(self, state: Any) -> None:
        started = await start(state)
        before = datetime.now(UTC)
        job = await claim_one(state, lease=60, worker="w-7")
        assert job.id == started.id and job.status == "running" and job.attempt == 1
        assert job.leased_by == "w-7" and job.lease_token
        assert job.leased_until is not None
        assert before + timedelta(seconds=59) <= job.leased_until
        assert job.leased_until <= datetime.now(UTC) + timedelta(seconds=61)
        assert (await state.get_job(job.id)).status == "running"
        assert await claim(state) == []

    async def test_acquire_takes_the_best_job_by_priority_then_schedule_then_id(
        self, state: Any
    ) -> None:
        now = datetime.now(UTC)
        late = await start(state, priority=0, input="late")
        early = await start(state, priority=0, run_at=now - timedelta(hours=1), input="early")
        urgent = await start(state, priority=-5, input="urgent")
        low = await start(state, priority=10, run_at=now - timedelta(hours=2), input="low")
        order = [(await claim_one(state)).id for _ in range(4)]
        # "early" asked for a past instant, which is stored as now: it ties with
        # "late" on scheduled_at or comes first; the id breaks ties by age.
        assert order[0] == urgent.id and order[-1] == low.id
        assert set(order[1:3]) == {late.id, early.id}

    async def test_acquire_only_claims_the_requested_types(self, state: Any) -> None:
        await start(state, "a")
        b = await start(state, "b")
        await start(state, "c")
        jobs = await claim(state, ["b", "x"], limit=10)
        assert [j.id for j in jobs] == [b.id]
        assert await claim(state, [], limit=10) == []

    async def test_a_claim_of_several_types_takes_the_best_jobs_across_them_in_order(
        self, state: Any
    ) -> None:
        by_priority = {}
        for n, type_name in enumerate(["a", "b", "c"] * 4):
            started = await start(state, type_name, priority=(n * 7) % 12)
            by_priority[(n * 7) % 12] = started.id
        first = await claim(state, ["a", "b", "c"], limit=5)
        assert [j.id for j in sorted(first, key=lambda j: j.priority)] == [
            by_priority[p] for p in range(5)
        ]
        rest = await claim(state, ["c", "a", "b"], limit=10)
        assert sorted(j.priority for j in rest) == list(range(5, 12))

    async def test_concurrent_claims_of_several_types_never_share_a_job_and_take_all(
        self, state: Any
    ) -> None:
        for n in range(24):
            await start(state, "abc"[n % 3])
        claimed: list[str] = []
        for _ in range(24):  # racing rounds until every job is claimed (each takes some)
            results = await asyncio.gather(
                *(claim(state, ["a", "b", "c"], limit=3, worker=f"w{n}") for n in range(4))
            )
            claimed += [job.id for jobs in results for job in jobs]
            if len(claimed) >= 24:
                break
        assert len(claimed) == 24 and len(set(claimed)) == 24

    async def test_batch_acquire_takes_up_to_limit_in_order(self, state: Any) -> None:
        started = [await start(state, priority=n) for n in range(5)]
        jobs = await claim(state, limit=3)
        assert [j.id for j in jobs] == [s.id for s in started[:3]]
        assert len({j.lease_token for j in jobs}) == 3
        rest = await claim(state, limit=10)
        assert [j.id for j in rest] == [s.id for s in started[3:]]

    async def test_ten_concurrent_acquirers_over_five_jobs_make_five_distinct_claims(
        self, state: Any
    ) -> None:
        for _ in range(5):
            await start(state)
        results = await asyncio.gather(*(claim(state, worker=f"w{n}") for n in range(10)))
        claimed = [job.id for jobs in results for job in jobs]
        assert len(claimed) == 5 and len(set(claimed)) == 5

    async def test_concurrent_batch_acquirers_never_share_a_job(self, state: Any) -> None:
        for _ in range(12):
            await start(state)
        results = await asyncio.gather(*(claim(state, limit=5, worker=f"w{n}") for n in range(4)))
        claimed = [job.id for jobs in results for job in jobs]
        assert len(claimed) == 12 and len(set(claimed)) == 12
