"""State-adapter conformance: reaping."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queuert_notify.errors import (
    JobOwnershipLostError,
)
from queuert_notify.testing.state_cases.support import (
    SHORT_LEASE,
    claim,
    claim_one,
    complete,
    start,
    token,
)
from state_adapters.model import Completion
from state_adapters.notifications import NotificationBuffer


class ReapingCases:
    """Reaping: cases every state adapter must pass."""

    async def test_an_expired_lease_is_reaped_back_to_pending(self, state: Any) -> None:
        await start(state)
        # A lease that outlasts a stall of a loaded machine between the claim and the
        # first reap, which must find it unexpired.
        lease = 2.5
        job = await claim_one(state, lease=lease)
        notes = NotificationBuffer()
        assert await state.reap_expired_leases(["t"], notes=notes) == []
        await asyncio.sleep(lease + 0.2)
        assert await state.reap_expired_leases(["other"], notes=notes) == []
        assert await state.reap_expired_leases(["t"], notes=notes) == [job.id]
        assert notes.lost_jobs == [job.id] and notes.scheduled == {"t": 1}
        stored = await state.get_job(job.id)
        assert stored.status == "pending" and stored.last_error
        again = await claim_one(state)
        assert again.id == job.id and again.attempt == 2
        assert again.lease_token != job.lease_token

    async def test_reaping_a_job_without_attempts_left_fails_its_chain(self, state: Any) -> None:
        started = await start(state, max_attempts=1)
        await claim_one(state, lease=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE + 0.2)
        notes = NotificationBuffer()
        assert await state.reap_expired_leases(None, notes=notes) == [started.id]
        assert (await state.get_chain(started.id)).status == "failed"
        assert notes.completed_chains == [started.id] and notes.lost_jobs == [started.id]

    async def test_overlapping_reapers_reap_each_job_once(self, state: Any) -> None:
        for _ in range(5):
            await start(state)
        jobs = await claim(state, limit=5, lease=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE + 0.2)
        results = await asyncio.gather(
            *(state.reap_expired_leases(["t"], notes=NotificationBuffer()) for _ in range(4))
        )
        reaped = [job_id for ids in results for job_id in ids]
        assert sorted(reaped) == sorted(j.id for j in jobs)

    async def test_a_zombie_completion_after_reap_and_reclaim_changes_nothing(
        self, state: Any
    ) -> None:
        await start(state)
        zombie = await claim_one(state, lease=SHORT_LEASE, worker="zombie")
        await asyncio.sleep(SHORT_LEASE + 0.2)
        await state.reap_expired_leases(["t"], notes=NotificationBuffer())
        owner = await claim_one(state, worker="owner")
        notes = NotificationBuffer()
        (late,) = await state.complete_jobs(
            [Completion(zombie.id, token(zombie), output="zombie")], notes=notes
        )
        assert isinstance(late, JobOwnershipLostError) and len(notes) == 0
        for write in (
            state.renew_lease(zombie.id, zombie.lease_token, 60),
            state.set_progress(zombie.id, zombie.lease_token, "zombie"),
            state.fail_job(zombie.id, zombie.lease_token, "zombie", notes=notes),
        ):
            with pytest.raises(JobOwnershipLostError):
                await write
        row = await state.get_job(owner.id)
        assert row.status == "running" and row.leased_by == "owner"
        assert row.lease_token == owner.lease_token and row.leased_until == owner.leased_until
        assert row.output is None and row.progress is None and row.last_error == owner.last_error
        assert (await complete(state, owner, "owner")).output == "owner"
