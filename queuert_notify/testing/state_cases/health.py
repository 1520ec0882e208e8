"""State-adapter conformance: the health report."""

from __future__ import annotations

import asyncio
from typing import Any

from queuert_notify.testing.state_cases.support import SHORT_LEASE, claim, start
from state_adapters.health import SEVERITIES, HealthThresholds


class HealthCases:
    """The health report: cases every state adapter must pass."""

    async def test_health_counts_the_backlog_and_judges_every_finding(self, state: Any) -> None:
        for _ in range(3):
            await start(state)
        report = await state.health()
        assert report.backlog.pending == 3
        assert report.findings and all(f.severity in SEVERITIES for f in report.findings)
        assert all(f.summary and f.meaning and f.action for f in report.findings)
        assert report.severity == max((f.severity for f in report.findings), key=SEVERITIES.index)

    async def test_a_lease_that_ran_out_is_a_warning_until_it_is_reaped(self, state: Any) -> None:
        await start(state)
        (job,) = await claim(state, lease=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE + 0.1)
        lapsed = await state.health(thresholds=HealthThresholds(lease_grace=0.0))
        assert lapsed.backlog.expired_leases == 1 and lapsed.severity != "ok"
        # (A shared server may add findings of its own, such as another's old transaction.)
        queue = [f for f in lapsed.problems() if f.subject in ("leases", "backlog")]
        assert [(f.subject, f.severity) for f in queue] == [("leases", "warning")]
        assert (await state.get_job(job.id)).status == "running"  # the report only reads
