"""One handler run under one lease, and the phases it goes through."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime

from queuert_notify.jobs import Job


class Phase(enum.Enum):
    """Where a run is. A lost lease cancels the handler only in ``IN_HANDLER``; in
    ``WRITING`` the outcome is written (fenced by the lease token), and a run leaves
    the worker's table of runs once that is done."""

    CLAIMED = "claimed"
    """Its task is created; the handler has not started."""
    IN_HANDLER = "in_handler"
    """The handler runs in the task; the lease keeper renews its lease."""
    WRITING = "writing"
    """The handler returned or raised; its completion or failure is being written."""


@dataclass(eq=False)
class JobRun:
    """A run of ``job`` under ``lease_token``.

    Facts that do not change the phase: ``lost_reason`` (the lease is no longer ours:
    write nothing), ``cancelled`` (the worker cancelled the handler's task because of
    it), ``abandoned`` (the worker stopped before the handler finished: the job runs
    again once its lease expires), ``holds_slot`` (until the handler finished: the
    outcome is then written without holding a slot).
    """

    job: Job
    lease_token: str
    leased_until: datetime | None
    phase: Phase = Phase.CLAIMED
    task: asyncio.Task[None] | None = None
    lost_reason: str | None = None
    cancelled: bool = False
    abandoned: bool = False
    holds_slot: bool = True
    renew_at: float = 0.0
    """``loop.time()`` from which the lease keeper extends this run's lease."""
    expires_at: float | None = None
    """``loop.time()`` by which the lease has expired (``None``: unknown). The handler's
    work is done by then, so writing its outcome is worth retrying until then rather
    than running the handler again after a reap."""
    checks: set[asyncio.Task[None]] = field(default_factory=set)
    """Ownership checks in flight (see ``LeaseKeeper.check_ownership``)."""

    @property
    def in_handler(self) -> bool:
        return self.phase is Phase.IN_HANDLER

    def lose(self, reason: str) -> None:
        """The lease is no longer ours: cancel the handler if it is running."""
        if self.lost_reason is None:
            self.lost_reason = reason
        if self.in_handler and not self.cancelled and self.task is not None:
            self.cancelled = True
            self.task.cancel()

    def abandon(self, reason: str) -> None:
        """The worker stops: the job runs again once its lease expires."""
        self.abandoned = True
        self.lose(reason)

    def lease_over(self) -> bool:
        """Whether the lease we know of has run out."""
        until = self.leased_until
        if until is None:
            return False
        return datetime.now(UTC) >= (until if until.tzinfo else until.replace(tzinfo=UTC))
