"""One handler run under one lease, and the phases it goes through."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from queuert_notify.jobs import Job
from queuert_notify.observe.instrumentation import NO_RUN_TRACE, RunTrace
from state_adapters.model import JobRecord

logger = logging.getLogger(__name__)


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


@dataclass(eq=False, slots=True)
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
    trace_context: str | None = None
    """As stored with the job: the trace this run continues."""
    trace: RunTrace = NO_RUN_TRACE
    """What the active instrumentation observes of this run."""

    @classmethod
    def claimed(cls, record: JobRecord, *, worker_id: str) -> JobRun | None:
        """The run of a job just claimed; ``None`` (logged) for a record without a lease
        token, whose outcome nothing could fence."""
        if record.lease_token is None:
            logger.error(
                "acquired a job without a lease token; skipping it",
                extra={"worker_id": worker_id, "job_id": record.id},
            )
            return None
        job = Job.from_record(record)
        return cls(job, record.lease_token, record.leased_until, trace_context=record.trace_context)

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

    async def run_handler(
        self, call: Callable[[], Awaitable[Any]], time_limit: float | None
    ) -> tuple[Any, BaseException | None]:
        """Run the handler (``call()``) in this task, within ``time_limit`` seconds:
        ``(output, None)``, or ``(None, what it raised)`` (:class:`HandlerTimeout` when
        the time limit expired). A cancel from :meth:`lose` ends it with
        ``CancelledError``; a cancel of the task from anywhere else propagates."""
        if self.lost_reason is not None:  # lost before it started
            return None, asyncio.CancelledError()
        self.phase = Phase.IN_HANDLER
        try:
            if time_limit is None:  # no timer: one coroutine fewer per run
                return await call(), None
            return await _within(call, time_limit), None
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if not self.cancelled and current is not None and current.cancelling():
                raise
            return None, exc
        except Exception as exc:
            return None, exc
        finally:
            self.phase = Phase.WRITING
            if self.cancelled:
                # Settle the cancel request, consumed by the handler or not, so the rest
                # of the run (writing the outcome) is not cancelled too.
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()

    async def cancel_checks(self) -> None:
        """The run is over: cancel its ownership checks in flight and wait for them."""
        if self.checks:
            for check in list(self.checks):
                check.cancel()
            await asyncio.gather(*self.checks, return_exceptions=True)

    def lease_over(self) -> bool:
        """Whether the lease we know of has run out."""
        until = self.leased_until
        if until is None:
            return False
        return datetime.now(UTC) >= (until if until.tzinfo else until.replace(tzinfo=UTC))


class HandlerTimeout(Exception):
    """The handler ran longer than the worker's ``handler_timeout``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"handler timed out after {seconds}s")


async def _within(call: Callable[[], Awaitable[Any]], time_limit: float) -> Any:
    deadline = asyncio.timeout(time_limit)
    try:
        async with deadline:
            return await call()
    except TimeoutError:
        if deadline.expired():
            raise HandlerTimeout(time_limit) from None
        raise  # the handler's own TimeoutError
