"""The job model as it crosses the state seam: the values a client or worker gives
the state adapter (new jobs and chains, completions) and gets back (records, pages,
outcomes), and the statuses a job goes through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS

JobStatus = Literal["blocked", "pending", "running", "completed", "failed", "cancelled"]
"""A job's status; a chain's status is its last job's."""
ALL_STATUSES: tuple[JobStatus, ...] = get_args(JobStatus)
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
UNFINISHED_STATUSES: tuple[JobStatus, ...] = tuple(
    s for s in ALL_STATUSES if s not in FINAL_STATUSES
)
DedupScope = Literal["incomplete", "ever"]
DEFAULT_PRUNE_BATCH_SIZE = 500
"""Chains deleted per transaction by retention: a batch holds its locks (on SQLite, the
database) for a few milliseconds."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to create: the first of a new chain, or the next of a chain."""

    type_name: str
    input: Any = None
    run_at: datetime | None = None
    """Not before this instant (UTC); ``None`` or a past instant means now."""
    priority: int = 0
    """Lower runs first."""
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS
    """Runs of the job at most (the first and its retries); ``None``: retry forever
    (with capped backoff)."""
    trace_context: str | None = None
    """Stored with the job and returned on its :class:`JobRecord`, never read by the
    adapter: how an instrumentation (``queuert_notify.otel``) continues the trace of
    the request that made the job in the process that runs it."""
    concurrency_key: str | None = None
    """The key ``key_concurrency`` counts running jobs by (e.g. a customer id). A
    chain's next job takes its predecessor's key unless it is given one."""
    validated: bool = field(default=False, repr=False, compare=False)
    """Set by :func:`state_adapters.validation.new_job` only: the adapter does not walk
    a job built there again (validation runs once per write)."""


@dataclass(frozen=True, slots=True)
class NewChain:
    """A chain to start: its first job plus chain-level options."""

    job: NewJob
    dedup_key: str | None = None
    dedup_scope: DedupScope = "incomplete"
    """``incomplete``: dedup only against chains not yet final; ``ever``: against all."""
    dedup_window: float | None = None
    """Seconds; when set, only chains created within the window deduplicate."""
    blockers: Sequence[str] = ()
    """Chain ids that must complete before the first job becomes pending."""
    id: str | None = None
    """The new chain's id (and its first job's); ``None``: the adapter makes one. The
    client sets it, so that a start repeated after a lost connection can tell whether
    the lost attempt committed."""
    validated: bool = field(default=False, repr=False, compare=False)
    """Set by :func:`state_adapters.validation.new_chain` only (see ``NewJob``)."""


@dataclass(frozen=True, slots=True)
class StartedChain:
    """Result of starting one chain."""

    id: str
    type_name: str
    deduplicated: bool
    """True when an existing chain with the same dedup key was returned instead."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job row as stored."""

    id: str
    type_name: str
    chain_id: str
    chain_index: int
    input: Any
    output: Any
    status: JobStatus
    priority: int
    created_at: datetime
    scheduled_at: datetime
    completed_at: datetime | None
    attempt: int
    """1 for the first run; incremented by every acquire."""
    max_attempts: int | None
    last_error: str | None
    leased_by: str | None
    lease_token: str | None
    leased_until: datetime | None
    deduplication_key: str | None
    progress: Any
    trace_context: str | None = None
    """As given on the :class:`NewJob` (``None`` from adapters that do not store it)."""
    concurrency_key: str | None = None


@dataclass(frozen=True, slots=True)
class ChainRecord:
    """A chain: its first job's identity, its last job's status and output."""

    id: str
    type_name: str
    """Type of the chain's first job."""
    status: JobStatus
    output: Any
    created_at: datetime
    completed_at: datetime | None
    last_job: JobRecord


@dataclass(frozen=True, slots=True)
class ContinueWith:
    """Finish the current job by creating the next job of its chain."""

    job: NewJob


LogPosition = tuple[int, int]
"""A line's place in its job's log: ``(attempt, seq)``."""


@dataclass(frozen=True, slots=True)
class JobLogLine:
    """One line a job logged: the ``seq``-th (from 1) of its ``attempt``."""

    job_id: str
    attempt: int
    seq: int
    at: datetime
    level: str
    """A ``logging`` level name: ``"INFO"``, ``"WARNING"`` ..."""
    message: str
    fields: Mapping[str, Any] | None = None
    """Small JSON values given with the line (``ctx.log(message, **fields)``)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """Finish a leased job with an output, or by continuing the chain."""

    job_id: str
    lease_token: str
    output: Any = None
    continue_with: ContinueWith | None = None
    log_lines: Sequence[JobLogLine] = ()
    """The job's last log lines, written in the completion's transaction if it holds."""
    validated: bool = field(default=False, repr=False, compare=False)
    """Set by :func:`state_adapters.validation.completion` only (see ``NewJob``)."""


@dataclass(frozen=True, slots=True)
class FailureOutcome:
    """What ``fail_job`` did: retried (``pending`` at ``retry_at``) or ``failed`` for good."""

    status: Literal["pending", "failed"]
    retry_at: datetime | None


WORKER_DEAD_AFTER = 180.0
"""Seconds without a heartbeat after which a worker counts as dead (a live one beats at
least every minute, with its reaper's tick)."""


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker as it recorded itself (``client.workers()``,
    :meth:`StateAdapter.workers`): ``type_names`` it handles, ``slots`` (its
    concurrency), when it started and last beat. Public as
    ``queuert_notify.WorkerRecord``; fields in docs/operations.md#workers."""

    id: str
    host: str
    pid: int
    type_names: tuple[str, ...]
    slots: int
    started_at: datetime
    heartbeat_at: datetime

    def alive(self, now: datetime) -> bool:
        """Beat within :data:`WORKER_DEAD_AFTER` seconds of ``now``."""
        return (now - self.heartbeat_at).total_seconds() <= WORKER_DEAD_AFTER


def unhandled_types(
    due: Mapping[str, int], workers: Sequence[WorkerRecord], now: datetime
) -> dict[str, int]:
    """The types among ``due`` (due jobs per type) that no live worker handles."""
    handled = {t for worker in workers if worker.alive(now) for t in worker.type_names}
    return {t: n for t, n in sorted(due.items()) if t not in handled}


def known_types(workers: Sequence[WorkerRecord], now: datetime) -> list[str]:
    """The types the live workers handle, sorted."""
    return sorted({t for worker in workers if worker.alive(now) for t in worker.type_names})


def unhandled_line(type_name: str, count: int, known: Sequence[str]) -> str:
    """The one line every place (worker log, CLI, dashboard) says about such a type."""
    return (
        f"{count} jobs of type {type_name!r} are due and no live worker handles that type; "
        f"known types: {', '.join(known) or 'none'}"
    )


@dataclass(frozen=True, slots=True)
class TypeLimits:
    """What is set for one job type (:meth:`StateAdapter.type_controls`); ``None``: no
    such limit."""

    type_name: str
    paused: bool = False
    concurrency: int | None = None
    """Running jobs of the type at most, across all workers."""
    key_concurrency: int | None = None
    """Running jobs per ``concurrency_key`` at most."""
    rate: int | None = None
    """Starts per ``per_seconds`` at most, in any window of that length."""
    per_seconds: float | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit is set (claims then take the type's lock)."""
        return (
            self.concurrency is not None
            or self.key_concurrency is not None
            or self.rate is not None
        )


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a keyset-paginated listing; pass ``next_cursor`` as ``after``."""

    items: Sequence[Any]
    next_cursor: str | None = field(default=None)


@dataclass(frozen=True, slots=True)
class ActivityMinute:
    """Jobs that reached a final status within one minute (``start`` to ``start`` + 60 s)."""

    start: datetime
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """The queue at a glance, read without counting every row of the jobs table.

    ``unfinished`` counts the blocked, pending and running jobs now, by type and status;
    ``finished`` counts the jobs that completed, failed or were cancelled since
    ``since``, by type and status, and ``minutes`` the same per minute (oldest first,
    quiet minutes left out). When more than the ``finished_limit`` asked for finished
    since ``since``, only the most recent that many are counted and ``truncated`` is
    True (the counts are then lower bounds).
    """

    since: datetime
    unfinished: Mapping[str, Mapping[str, int]]
    finished: Mapping[str, Mapping[str, int]]
    minutes: Sequence[ActivityMinute]
    truncated: bool = False

    @property
    def type_names(self) -> list[str]:
        """Every type with an unfinished job or a job finished since ``since``, sorted."""
        return sorted({*self.unfinished, *self.finished})


@dataclass(frozen=True, slots=True)
class ChainLinks:
    """Which chains a chain's jobs wait (or waited) for, and which chains wait on it."""

    blocked_by: Sequence[str]
    blocking: Sequence[str]
