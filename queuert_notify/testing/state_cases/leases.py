"""State-adapter conformance: leases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import (
    InvalidInputError,
    JobOwnershipLostError,
)
from queuert_notify.testing.state_cases.support import (
    claim_one,
    start,
    token,
)


class LeasesCases:
    """Leases: cases every state adapter must pass."""

    async def test_renew_lease_extends_it_and_a_stale_token_is_refused(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state, lease=1)
        until = await state.renew_lease(job.id, token(job), 120)
        assert until > datetime.now(UTC) + timedelta(seconds=100)
        assert (await state.get_job(job.id)).leased_until == until
        with pytest.raises(JobOwnershipLostError):
            await state.renew_lease(job.id, "0" * 32, 120)
        assert (await state.get_job(job.id)).leased_until == until

    async def test_progress_is_stored_under_the_lease_only(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state)
        await state.set_progress(job.id, job.lease_token, {"done": 3, "of": 10})
        assert (await state.get_job(job.id)).progress == {"done": 3, "of": 10}
        with pytest.raises(JobOwnershipLostError):
            await state.set_progress(job.id, "0" * 32, {"done": 99})
        with pytest.raises(InvalidInputError):
            await state.set_progress(job.id, job.lease_token, {"x": float("nan")})
        assert (await state.get_job(job.id)).progress == {"done": 3, "of": 10}
