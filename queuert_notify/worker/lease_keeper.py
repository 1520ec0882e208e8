"""Keeping the leases of a worker's running handlers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime

from queuert_notify.errors import JobOwnershipLostError
from queuert_notify.worker.job_run import JobRun, Phase
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

RENEW_RETRY = 0.25
"""Seconds at most between a failed lease renewal and the next attempt."""


def _leased(run: JobRun) -> bool:
    """Whether ``run``'s lease is kept: its handler runs, or it waits to start (a job
    claimed ahead of a free slot), and the lease was not lost."""
    return run.lost_reason is None and run.phase is not Phase.WRITING


class LeaseKeeper:
    """Renews the lease of every running handler, and of every job claimed ahead that
    waits for a slot, once a third of it has passed: one
    task for the whole worker rather than a timer per job. A refused renewal cancels
    that handler; a failed one is retried at the next tick (a quarter of a second at
    most) until the lease expires: the pool replaces a dead connection at once, and a
    lease must not hang on two attempts a third of it apart. An ownership-lost
    notification is confirmed with a fenced renewal before the handler is cancelled
    (notifications are hints: they may be stale or forged)."""

    def __init__(
        self,
        state: StateAdapter,
        lease: float,
        runs: Iterable[JobRun],
        *,
        worker_id: str,
    ) -> None:
        self._state = state
        self._lease = lease
        self._runs = runs
        self._worker_id = worker_id

    async def run(self) -> None:
        """Renew until cancelled."""
        loop = asyncio.get_running_loop()
        tick = min(self._lease / 12, RENEW_RETRY)
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            due = [run for run in self._runs if _leased(run) and run.renew_at <= now]
            if due:
                await asyncio.gather(*(self._renew(run) for run in due))

    def granted(self, run: JobRun, claimed_at: float) -> None:
        """A claim sent at ``claimed_at`` (``loop.time()``) gave ``run`` its lease."""
        run.renew_at = claimed_at + self._lease / 3
        # The lease was granted after the claim was sent: it ends no earlier than this.
        run.expires_at = None if run.leased_until is None else claimed_at + self._lease

    def renewed(self, run: JobRun, until: datetime) -> None:
        """The handler renewed its lease itself (``ctx.heartbeat()``) up to ``until``."""
        run.leased_until = until
        left = (until if until.tzinfo else until.replace(tzinfo=UTC)) - datetime.now(UTC)
        run.expires_at = asyncio.get_running_loop().time() + left.total_seconds()

    def check_ownership(self, run: JobRun) -> None:
        """An ownership-lost notification arrived for ``run``'s job."""
        if run.lost_reason is not None or not run.in_handler:
            return
        check = asyncio.create_task(self._confirm_loss(run))
        run.checks.add(check)
        check.add_done_callback(run.checks.discard)

    async def _renew(self, run: JobRun) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            run.leased_until = await self._state.renew_lease(
                run.job.id, run.lease_token, self._lease
            )
            run.expires_at = sent + self._lease
            run.renew_at = loop.time() + self._lease / 3
        except JobOwnershipLostError:
            run.lose("lease renewal refused")
        except Exception:
            logger.warning("lease renewal failed; retrying", exc_info=True, extra=self._extra(run))
            if run.lease_over():
                run.lose("lease expired while renewal kept failing")
            run.renew_at = loop.time() + min(self._lease / 12, RENEW_RETRY)

    async def _confirm_loss(self, run: JobRun) -> None:
        sent = asyncio.get_running_loop().time()
        try:
            run.leased_until = await self._state.renew_lease(
                run.job.id, run.lease_token, self._lease
            )
            run.expires_at = sent + self._lease
        except JobOwnershipLostError:
            run.lose("ownership lost")
        except Exception:
            logger.warning("could not confirm ownership", exc_info=True, extra=self._extra(run))

    def _extra(self, run: JobRun) -> dict[str, object]:
        job = run.job
        return {
            "job_id": job.id,
            "type_name": job.type_name,
            "attempt": job.attempt,
            "worker_id": self._worker_id,
        }
