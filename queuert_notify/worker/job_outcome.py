"""What a finished handler's run leads to: its completion, a retry or a failure."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from queuert_notify.client.client import Client
from queuert_notify.errors import ConfigurationError, InvalidInputError, JobOwnershipLostError
from queuert_notify.job_logs.writer import JobLogWriter
from queuert_notify.jobs import Job, JobContext
from queuert_notify.observe.instrumentation import RunOutcome
from queuert_notify.worker.completion_batcher import CompletionBatcher
from queuert_notify.worker.job_run import HandlerTimeout, JobRun
from queuert_notify.worker.settings import WorkerSettings
from state_adapters import validation
from state_adapters.model import Completion, JobLogLine
from state_adapters.notifications import NotificationBuffer
from state_adapters.transactions.connection_loss import retry_on_connection_loss

logger = logging.getLogger(__name__)

_MAX_ERROR_TEXT = 8000
_MAX_RETRY_DELAY = 366 * 24 * 3600.0
"""A retry further away than a year is taken for a bug in ``retry_backoff``."""

Emit = Callable[..., None]
"""``emit(kind, job, **details)``: a worker event."""


class OutcomeWriter:
    """Writes the outcome of each finished handler of one worker.

    Invariants: nothing is written for a run whose lease was lost or that the worker
    abandoned (the job runs again); every write is fenced by the run's lease token,
    and one lost to a dropped connection is rewritten until the lease expires (a
    repeat after a commit that did land is refused and changes nothing); a handler's
    own transaction (atomic mode) commits with exactly its completion, and its failure
    rolls it back; the handler's error is what a failed attempt records.
    """

    def __init__(
        self,
        client: Client,
        batcher: CompletionBatcher,
        *,
        emit: Emit,
        release_slot: Callable[[JobRun], None],
        continued: Callable[[str], None],
        settings: WorkerSettings,
    ) -> None:
        self._client = client
        self.logs = JobLogWriter(client.state, settings)
        """Writes the log lines of this worker's attempts."""
        self._batcher = batcher
        self._emit = emit
        self._release_slot = release_slot
        self._continued = continued
        self._retry_backoff = settings.retry_backoff
        self._worker_id = settings.worker_id

    async def finish(
        self,
        run: JobRun,
        ctx: JobContext,
        result: Any,
        exc: BaseException | None,
        lines: list[JobLogLine],
    ) -> list[JobLogLine]:
        """Write the outcome of a finished handler: completion, retry or failure, and the
        attempt's last log ``lines``: with the completion (in its transaction), or on their
        own after the handler's transaction rolled back and before a failure is recorded.
        Returns the lines left to write once the handler's transaction is closed (a run
        that lost its job or was abandoned; a completion refused for a stale token)."""
        job = run.job
        if run.abandoned:
            logger.warning(
                "worker stopped before the handler finished; the job runs again once its "
                "lease expires",
                extra=self._extra(job),
            )
            self._report(run, "abandoned", error=run.lost_reason)
            return lines
        if run.lost_reason is not None or isinstance(exc, asyncio.CancelledError):
            reason = run.lost_reason or "handler cancelled"
            logger.warning(
                "job ownership lost; handler cancelled",
                extra={**self._extra(job), "reason": reason},
            )
            self._report(run, "ownership_lost", error=reason)
            return lines
        if exc is None:
            try:
                ctx.check_returned(result)
                completion = validation.completion(run.job.id, run.lease_token, result, lines)
            except (InvalidInputError, ConfigurationError) as invalid:
                # The handler's result cannot be stored (output not JSON, a continuation
                # misused): every attempt would end the same way.
                await self._fail(run, ctx, invalid, lines, final=True)
                return []
            else:
                return await self._complete(run, ctx, completion)
        await self._fail(run, ctx, exc, lines)
        return []

    async def _complete(
        self, run: JobRun, ctx: JobContext, completion: Completion
    ) -> list[JobLogLine]:
        job = run.job
        # A handler that never wrote through ctx.session has nothing to commit with its
        # completion, which then shares a batch like a staged one.
        transaction = ctx.transaction if ctx.transaction and ctx.transaction.holds_work() else None
        try:
            if transaction is not None:
                outcome = await transaction.complete(
                    self._client.state, completion, self._client.notify
                )
            else:
                batcher = self._batcher
                self._release_slot(run)
                # Fenced by the lease token: a repeat after a commit that did land is
                # refused and changes nothing.
                outcome = await retry_on_connection_loss(
                    lambda: batcher.complete(completion),
                    what="completing a job",
                    until=run.expires_at,
                )
        except Exception as exc:
            if transaction is not None:
                # Usually the handler's own writes (an IntegrityError flushed at COMMIT):
                # a failed attempt, recorded and retried like an exception in the handler.
                await self._fail(run, ctx, exc, list(completion.log_lines))
                return []
            logger.exception(
                "completing the job failed; it will be retried when its lease expires",
                extra=self._extra(job),
            )
            return list(completion.log_lines)
        if isinstance(outcome, JobOwnershipLostError):
            logger.warning(
                "job completed elsewhere or reaped before its completion; result discarded",
                extra=self._extra(job),
            )
            self._report(run, "ownership_lost", error=str(outcome))
            return list(completion.log_lines)
        next_type = completion.continue_with.job.type_name if completion.continue_with else None
        self._report(run, "completed", continued_with=next_type)
        if next_type is not None:
            self._continued(next_type)
        return []

    async def _fail(
        self,
        run: JobRun,
        ctx: JobContext,
        exc: BaseException,
        lines: list[JobLogLine],
        *,
        final: bool = False,
    ) -> None:
        job = run.job
        if ctx.transaction is not None:
            with suppress(Exception):
                await ctx.transaction.rollback()
        # After the rollback (on SQLite the handler's transaction holds the write lock),
        # before the failure is recorded (a reader who sees it sees the lines).
        await self.logs.write(lines)
        if isinstance(exc, HandlerTimeout):
            error = str(exc)
        else:
            error = "".join(traceback.format_exception(exc))[-_MAX_ERROR_TEXT:]
        retry_delay = self._retry_delay(job)
        # Misuse (ctx.session in staged mode, a continuation not returned, an output or
        # a continuation's input that is not JSON: the library's ConfigurationError or
        # InvalidInputError) fails the same way on every attempt: the chain fails at once.
        final = final or isinstance(exc, ConfigurationError | InvalidInputError)
        notes = NotificationBuffer()
        try:
            outcome = await retry_on_connection_loss(
                lambda: self._client.state.fail_job(
                    job.id,
                    run.lease_token,
                    error,
                    notes=notes,
                    retry_delay=retry_delay,
                    final=final,
                ),
                what="recording a failed attempt",
                until=run.expires_at,
            )
        except JobOwnershipLostError as lost:
            self._report(run, "ownership_lost", error=str(lost))
            return
        except Exception:
            logger.exception(
                "recording a failed attempt failed; the job will be retried when its lease expires",
                extra=self._extra(job),
            )
            return
        await self._client.flush(notes)
        timed_out = isinstance(exc, HandlerTimeout)
        summary = error if timed_out else f"{type(exc).__name__}: {exc}"
        exc_info = None if timed_out else exc
        if outcome.status == "pending":
            logger.warning(
                "job %s (%s) attempt %d failed; will retry: %s",
                job.id,
                job.type_name,
                job.attempt,
                summary,
                exc_info=exc_info,
                extra={**self._extra(job), "retry_at": outcome.retry_at},
            )
            self._report(run, "retried", exc, error=summary, retry_at=outcome.retry_at)
        else:
            logger.error(
                "job %s (%s) attempt %d failed; %s: %s",
                job.id,
                job.type_name,
                job.attempt,
                "not retried (it would fail the same way again)" if final else "no attempts left",
                summary,
                exc_info=exc_info,
                extra=self._extra(job),
            )
            self._report(run, "failed", exc, error=summary)

    def _report(
        self,
        run: JobRun,
        outcome: RunOutcome,
        exc: BaseException | None = None,
        *,
        error: str | None = None,
        **details: Any,
    ) -> None:
        """How ``run`` ended: to its trace (with the exception when there is one) and as
        the worker's event."""
        run.trace.outcome(outcome, exc if exc is not None else error)
        self._emit(outcome, run.job, error=error, **details)

    def _retry_delay(self, job: Job) -> float | None:
        """``retry_backoff(attempt)`` when it gives a usable delay; otherwise (it raised,
        or gave NaN, a negative number, a string, years) a warning and ``None``, the state
        adapter's default backoff: a bad backoff must not lose the handler's error."""
        if self._retry_backoff is None:
            return None
        try:
            delay = self._retry_backoff(job.attempt)
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}"
        else:
            if (
                isinstance(delay, int | float)
                and not isinstance(delay, bool)
                and 0 <= delay <= _MAX_RETRY_DELAY
            ):
                return float(delay)
            problem = f"returned {delay!r}, not seconds in [0, {_MAX_RETRY_DELAY:.0f}]"
        logger.warning(
            "retry_backoff(%d) %s; using the default backoff",
            job.attempt,
            problem,
            extra=self._extra(job),
        )
        return None

    def _extra(self, job: Job) -> dict[str, Any]:
        return {
            "job_id": job.id,
            "type_name": job.type_name,
            "attempt": job.attempt,
            "worker_id": self._worker_id,
        }
