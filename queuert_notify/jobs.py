"""What a handler sees: the :class:`Job` it runs, its :class:`JobContext`, and the registry
that maps type names to handlers.

A handler is ``async def handler(job, ctx) -> output`` (or a plain ``def``, run in a
thread). It finishes its job by returning a JSON-serializable output, which completes
the chain, or by returning ``ctx.continue_with(type_name, input)``, which creates the
chain's next job in the same transaction as the completion.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from queuert_notify.errors import ConfigurationError, InvalidInputError
from queuert_notify.observe.instrumentation import NO_RUN_TRACE, RunTrace
from state_adapters.model import ContinueWith, JobRecord
from state_adapters.protocol import StateAdapter

if TYPE_CHECKING:
    from queuert_notify.job_logs.attempt_log import AttemptLog
    from state_adapters.transactions.handler_transaction import HandlerTransaction
from state_adapters.storable import check_json
from state_adapters.validation import check_type_name, new_job

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

Handler: TypeAlias = (
    Callable[["Job", "JobContext"], Awaitable[Any]] | Callable[["Job", "JobContext"], Any]
)
"""``(job, ctx) -> output | ContinueWith``; a coroutine function or a plain function."""


@dataclass(frozen=True, slots=True)
class Job:
    """The job a handler runs, as it was when this worker acquired it."""

    id: str
    chain_id: str
    chain_index: int
    """0 for the chain's first job, 1 for its first continuation, ..."""
    type_name: str
    input: Any
    attempt: int
    """1 on the first run; a retry or a reaped lease runs it again with attempt + 1."""
    max_attempts: int | None
    priority: int
    created_at: datetime
    scheduled_at: datetime
    concurrency_key: str | None = None
    """What the type's ``key_concurrency`` limit counts this job by."""

    @classmethod
    def from_record(cls, record: JobRecord) -> Job:
        # Positional, in the order of the fields: built for every job a worker claims.
        return cls(
            record.id,
            record.chain_id,
            record.chain_index,
            record.type_name,
            record.input,
            record.attempt,
            record.max_attempts,
            record.priority,
            record.created_at,
            record.scheduled_at,
            record.concurrency_key,
        )


class Inherit(enum.Enum):
    """``max_attempts`` of a continuation that takes the current job's."""

    CHAIN = "chain"


class JobContext:
    """Per-run services for a handler.

    Every write made through the context is fenced by this run's lease token: once the
    worker has lost the job (lease reaped, chain cancelled or completed elsewhere) the
    write changes nothing and raises :class:`~queuert_notify.errors.JobOwnershipLostError`.
    """

    def __init__(
        self,
        job: Job,
        *,
        state: StateAdapter,
        worker_id: str,
        lease_token: str,
        lease_seconds: float,
        transaction: HandlerTransaction | None,
        no_session_reason: str = "ctx.session is not available here",
        on_progress: Callable[[Any], None],
        on_lease_renewed: Callable[[datetime], None],
        log: AttemptLog,
        trace: RunTrace = NO_RUN_TRACE,
    ) -> None:
        self.job = job
        self._log = log
        self.worker_id = worker_id
        self._state = state
        self._lease_token = lease_token
        self._lease_seconds = lease_seconds
        self.transaction = transaction
        """The handler's transaction in atomic mode (``None``: no ``ctx.session``)."""
        self._no_session_reason = no_session_reason
        self._on_progress = on_progress
        self._on_lease_renewed = on_lease_renewed
        self._continuations: list[ContinueWith] = []
        self._trace = trace

    @property
    def session(self) -> AsyncSession:
        """The transaction this job's completion commits in (atomic mode only).

        Rows the handler writes here commit together with the completion and any
        ``continue_with``, or not at all (handler error, lost ownership). The session is
        opened on first access; a handler that never touches it costs no transaction.
        """
        if self.transaction is None:
            raise ConfigurationError(self._no_session_reason)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigurationError(
                "ctx.session is an AsyncSession of the worker's event loop and cannot be used "
                "from a plain def handler, which runs in a thread: make the handler an async "
                "def, or run sync code on the session with `await ctx.session.run_sync(fn)`"
            ) from None
        return self.transaction.session

    async def set_progress(self, progress: Any) -> None:
        """Store a JSON-serializable progress value on the job (visible to ``get_job``)."""
        check_json(progress, "progress")
        await self._state.set_progress(self.job.id, self._lease_token, progress)
        self._on_progress(progress)

    def log(self, message: str, **fields: Any) -> None:
        """Add a line to this attempt's log (read with ``client.job_logs(job.id)``), with
        small JSON ``fields``. Never waits for the database: lines are written in batches
        while the job runs (at most a second apart) and with its outcome; past the
        worker's bound per attempt (``job_log_lines``, ``job_log_bytes``) lines are
        counted and dropped. Safe from a plain ``def`` handler's thread."""
        self._log.add("INFO", str(message), fields or None)

    async def heartbeat(self) -> None:
        """Extend the lease now and confirm this run still owns the job.

        The worker renews leases by itself; call this before an irreversible external
        action to be sure the job was not reaped in the meantime.
        """
        leased_until = await self._state.renew_lease(
            self.job.id, self._lease_token, self._lease_seconds
        )
        self._on_lease_renewed(leased_until)

    def continue_with(
        self,
        type_name: str,
        input: Any = None,
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
        priority: int = 0,
        max_attempts: int | Inherit | None = Inherit.CHAIN,
        concurrency_key: str | None = None,
    ) -> ContinueWith:
        """A marker to ``return`` from the handler: complete this job by creating the
        chain's next job of ``type_name`` (validated now, written with the completion).
        The next job gets this job's ``max_attempts`` unless given (``None``: retry
        forever), and this job's ``concurrency_key`` unless given. Calling this without
        returning its result fails the attempt."""
        continuation = ContinueWith(
            job=new_job(
                type_name,
                input,
                run_at=run_at,
                delay=delay,
                priority=priority,
                max_attempts=self.job.max_attempts
                if max_attempts is Inherit.CHAIN
                else max_attempts,
                # The next job's run continues this run's trace, in whatever process.
                trace_context=self._trace.continuation_context(),
                concurrency_key=concurrency_key,
            )
        )
        self._continuations.append(continuation)
        return continuation

    def check_returned(self, result: Any) -> None:
        """Raise ``ConfigurationError`` when the handler made a continuation it did not
        return: the chain would complete and silently drop it."""
        if any(made is not result for made in self._continuations):
            raise ConfigurationError(
                "the handler called ctx.continue_with(...) without returning its result, so "
                "the chain would end here; write `return ctx.continue_with(...)`"
            )


class HandlerRegistry:
    """Type name -> handler. A worker claims only the type names registered here."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        if not handlers:
            raise InvalidInputError("a worker needs at least one handler: handlers={type: fn}")
        self._handlers: dict[str, Handler] = {}
        self._is_async: dict[str, bool] = {}
        for type_name, handler in handlers.items():
            check_type_name(type_name)
            if not callable(handler):
                raise InvalidInputError(f"the handler for {type_name!r} is not callable")
            self._handlers[type_name] = handler
            self._is_async[type_name] = _is_coroutine_function(handler)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._handlers

    async def call(self, job: Job, ctx: JobContext) -> Any:
        """Run the handler for ``job.type_name``; a plain function runs in a thread so
        it cannot block the event loop."""
        handler = self._handlers[job.type_name]
        if self._is_async[job.type_name]:
            result = handler(job, ctx)
        else:
            result = await asyncio.to_thread(handler, job, ctx)
        if inspect.isawaitable(result):
            result = await result
        return result


def _is_coroutine_function(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  # async callable objects
    )
