"""The state seam: everything the client and workers need from durable job storage.

Every mutating method accepts the caller's ``AsyncSession`` or
``AsyncConnection`` as ``session`` and then writes inside the caller's
transaction without committing it; without one, the adapter opens, commits and
closes its own transaction before returning. The notifications a change
implies are recorded into ``notes`` (a :class:`NotificationBuffer`) and sent by
the caller only after the transaction commits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, get_args

from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS

# Only type-checking imports from queuert_notify: it imports this module at
# runtime, so a runtime import back would be a cycle.
if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from state_adapters.errors import JobOwnershipLostError
    from state_adapters.handler_transaction import HandlerTransaction
    from state_adapters.notifications import NotificationBuffer

    CallerSession: TypeAlias = AsyncSession | AsyncConnection | None

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


@dataclass(frozen=True, slots=True)
class Completion:
    """Finish a leased job with an output, or by continuing the chain."""

    job_id: str
    lease_token: str
    output: Any = None
    continue_with: ContinueWith | None = None
    validated: bool = field(default=False, repr=False, compare=False)
    """Set by :func:`state_adapters.validation.completion` only (see ``NewJob``)."""


@dataclass(frozen=True, slots=True)
class FailureOutcome:
    """What ``fail_job`` did: retried (``pending`` at ``retry_at``) or ``failed`` for good."""

    status: Literal["pending", "failed"]
    retry_at: datetime | None


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


class StateAdapter(Protocol):
    """Durable job state. See the module docstring for sessions and ``notes``."""

    async def migrate(self) -> None:
        """Create or upgrade the schema; idempotent and safe to run concurrently."""
        ...

    async def start_chains(
        self,
        chains: Sequence[NewChain],
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> list[StartedChain]:
        """Create chains atomically (all or none); race-free deduplication."""
        ...

    async def acquire(
        self,
        type_names: Sequence[str],
        *,
        worker_id: str,
        lease_seconds: float,
        limit: int = 1,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` of the best eligible pending jobs of these
        types in one statement; never hands one job to two callers."""
        ...

    async def next_due_at(self, type_names: Sequence[str]) -> datetime | None:
        """Earliest ``scheduled_at`` of a pending job of these types, if any."""
        ...

    async def renew_lease(self, job_id: str, lease_token: str, lease_seconds: float) -> datetime:
        """Extend the lease; returns the new ``leased_until``.
        Raises ``JobOwnershipLostError`` for a stale token."""
        ...

    async def set_progress(self, job_id: str, lease_token: str, progress: Any) -> None:
        """Store progress (fenced by the lease token)."""
        ...

    async def complete_jobs(
        self,
        completions: Sequence[Completion],
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> list[JobRecord | JobOwnershipLostError]:
        """Complete several leased jobs in one transaction. Per completion:
        the completed job (a chain's last job also completes the chain and
        unblocks dependents), or a ``JobOwnershipLostError`` for a stale
        token, which changes nothing for that job."""
        ...

    async def fail_job(
        self,
        job_id: str,
        lease_token: str,
        error: str,
        *,
        notes: NotificationBuffer,
        retry_delay: float | None = None,
        final: bool = False,
    ) -> FailureOutcome:
        """Record a failed attempt: back to pending after a backoff (or
        ``retry_delay``), or ``failed`` when attempts are exhausted or the failure
        is ``final`` (retrying cannot help). Fenced: raises ``JobOwnershipLostError``
        for a stale token."""
        ...

    async def reap_expired_leases(
        self, type_names: Sequence[str] | None, *, notes: NotificationBuffer, limit: int = 100
    ) -> list[str]:
        """Return running jobs with an expired lease to pending (or failed);
        each exactly once even with overlapping reapers. Returns reaped job ids."""
        ...

    async def cancel_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Cancel a chain's unfinished job (running ones lose ownership)."""
        ...

    async def retry_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Run a failed or cancelled chain again from its last job, its attempts
        starting over; ``InvalidInputError`` for any other chain."""
        ...

    async def trigger_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Make the chain's pending job due now."""
        ...

    async def complete_chain(
        self,
        chain_id: str,
        output: Any,
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> ChainRecord:
        """Workerless completion from application code."""
        ...

    async def delete_chain(self, chain_id: str, *, session: CallerSession = None) -> None:
        """Delete a chain and its jobs; raises ``ChainInUseError`` while other
        jobs are blocked on it."""
        ...

    async def get_chain(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """Raises ``ChainNotFoundError``."""
        ...

    async def get_chains(
        self, chain_ids: Sequence[str], *, session: CallerSession = None
    ) -> list[ChainRecord]:
        """The chains among ``chain_ids`` that exist, in the order given, in one read;
        unknown ids are left out."""
        ...

    async def get_job(self, job_id: str, *, session: CallerSession = None) -> JobRecord:
        """Raises ``JobNotFoundError``."""
        ...

    async def list_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Newest first, keyset-paginated."""
        ...

    async def list_jobs(
        self,
        *,
        chain_id: str | None = None,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Newest first (by chain order inside a chain), keyset-paginated."""
        ...

    async def count_jobs(self, *, type_names: Sequence[str] | None = None) -> Mapping[str, int]:
        """Number of jobs per status (for the CLI and dashboards)."""
        ...

    async def count_active_jobs(self, type_names: Sequence[str]) -> Mapping[str, Mapping[str, int]]:
        """Type name -> ``{"pending": n, "running": m}`` for every type of ``type_names``
        (zeros included); its cost follows the unfinished jobs, not the table (polled
        for gauges while workers run)."""
        ...

    async def queue_overview(
        self, *, since: datetime, finished_limit: int = 100_000
    ) -> QueueOverview:
        """Jobs by type and status: unfinished ones now, finished ones since ``since``
        (the most recent ``finished_limit`` at most). Its cost grows with the unfinished
        jobs and the jobs finished since ``since``, never with the whole table."""
        ...

    async def find_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        search: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Chains newest first, keyset-paginated like :meth:`list_chains`, filtered by
        status (of the last job), type (of the first job) and ``search``: a chain id, the
        id of any job of the chain, or the chain's deduplication key."""
        ...

    async def chain_links(self, chain_id: str, *, limit: int = 100) -> ChainLinks:
        """The chains ``chain_id``'s jobs are blocked by and the chains whose jobs are
        blocked by it (at most ``limit`` of each, newest first)."""
        ...

    # -- operating the queue ---------------------------------------------------------

    async def prune_chains(
        self, finished_before: datetime, *, batch_size: int = DEFAULT_PRUNE_BATCH_SIZE
    ) -> int:
        """Delete at most ``batch_size`` chains that finished (completed, failed or
        cancelled) before ``finished_before``, oldest first, with their jobs, blocker
        links and dedup keys, in one short transaction; returns how many. Never a chain
        that a job of an unfinished chain waits on; concurrent callers never pick the
        same chains nor wait on each other's. Call it until it returns less than
        ``batch_size`` to prune everything."""
        ...

    async def take_schedule_tick(
        self,
        name: str,
        tick: datetime,
        chain: NewChain | None,
        *,
        notes: NotificationBuffer,
    ) -> StartedChain | None:
        """Record ``tick`` as schedule ``name``'s last tick and start ``chain`` in the same
        transaction, if no tick at or after ``tick`` was recorded: exactly one of any
        number of concurrent callers starts it. Returns the started chain, or ``None``
        when the tick was taken already. ``chain=None`` registers a schedule seen for
        the first time: ``tick`` is recorded only if the schedule has no tick yet, and
        nothing is started."""
        ...

    async def schedule_ticks(self, names: Sequence[str]) -> Mapping[str, datetime]:
        """The last tick recorded for each of these schedules that has one."""

    # -- operating the queue ---------------------------------------------------------

    async def pause_type(self, type_name: str, *, notes: NotificationBuffer) -> None:
        """Stop every worker from claiming jobs of ``type_name`` (running ones finish);
        stored, so it holds for workers started later, until :meth:`resume_type`."""
        ...

    async def resume_type(self, type_name: str, *, notes: NotificationBuffer) -> None:
        """Let workers claim ``type_name`` again; notes its pending jobs as scheduled, so
        idle workers wake at once."""
        ...

    async def paused_types(self) -> set[str]:
        """The types paused now."""
        ...

    async def set_limits(
        self,
        type_name: str,
        *,
        concurrency: int | None,
        key_concurrency: int | None,
        rate: int | None,
        per_seconds: float | None,
        notes: NotificationBuffer,
    ) -> TypeLimits:
        """Replace the limits of ``type_name`` (``None`` lifts one), held across every
        worker and process; ``rate`` needs ``per_seconds``. Returns what is set."""
        ...

    async def type_controls(self) -> list[TypeLimits]:
        """Every type that is paused or limited, by name."""
        ...

    # -- what a worker's loop uses ---------------------------------------------------

    @property
    def completes_with_claims(self) -> bool:
        """Whether a worker should hand the completions waiting to be written to its
        next claim (:meth:`complete_and_acquire`) rather than write them alongside it."""
        ...

    def holding_connections(self) -> AbstractAsyncContextManager[None]:
        """While open, the calls a worker repeats may keep connections out of the pool."""
        ...

    def handler_transaction(self) -> HandlerTransaction | None:
        """A new transaction for one atomic-mode handler run (``ctx.session``), or
        ``None`` when this adapter has none (atomic handlers then get a
        ``ConfigurationError`` from ``ctx.session``)."""
        ...

    def connection_capacity(self) -> int | None:
        """How many connections this adapter's pool keeps (``None``: unknown), so a
        worker can say when ``concurrency`` atomic handlers would exceed it."""
        ...

    async def complete_and_acquire(
        self,
        completions: Sequence[Completion],
        *,
        notes: NotificationBuffer,
        type_names: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
    ) -> tuple[list[JobOwnershipLostError | None], list[JobRecord]]:
        """Write ``completions`` (``None`` per written one, the error of a stale lease
        otherwise; no rows read back), then claim up to ``limit`` jobs (0: none)."""
        ...


class StateAdapterBase:
    """Defaults for the worker-loop capabilities of :class:`StateAdapter`, for adapters
    without a faster way: completions and claims in separate calls, no connections
    kept; and for operating the queue: nothing is ever paused or limited, and pausing
    or setting limits raises ``ConfigurationError``. Subclass it and implement the
    rest of the protocol."""

    async def pause_type(self, type_name: str, *, notes: NotificationBuffer) -> None:
        raise _unsupported(self, "pause_type")

    async def resume_type(self, type_name: str, *, notes: NotificationBuffer) -> None:
        raise _unsupported(self, "resume_type")

    async def paused_types(self) -> set[str]:
        return set()

    async def set_limits(
        self,
        type_name: str,
        *,
        concurrency: int | None,
        key_concurrency: int | None,
        rate: int | None,
        per_seconds: float | None,
        notes: NotificationBuffer,
    ) -> TypeLimits:
        raise _unsupported(self, "limits (set_limits)")

    async def type_controls(self) -> list[TypeLimits]:
        return []

    @property
    def completes_with_claims(self) -> bool:
        return False

    def handler_transaction(self) -> HandlerTransaction | None:
        return None

    def connection_capacity(self) -> int | None:
        return None

    def holding_connections(self) -> AbstractAsyncContextManager[None]:
        return _nothing_held()

    async def count_active_jobs(
        self: StateAdapter, type_names: Sequence[str]
    ) -> Mapping[str, Mapping[str, int]]:
        # One count_jobs per type: correct on any adapter, though it may read every job
        # of the type; adapters override it with a query that reads only unfinished ones.
        from state_adapters.job_counts import from_status_counts

        return {
            name: from_status_counts(await self.count_jobs(type_names=[name]))
            for name in type_names
        }

    async def prune_chains(
        self, finished_before: datetime, *, batch_size: int = DEFAULT_PRUNE_BATCH_SIZE
    ) -> int:
        raise _unsupported(self, "retention (prune_chains)")

    async def take_schedule_tick(
        self,
        name: str,
        tick: datetime,
        chain: NewChain | None,
        *,
        notes: NotificationBuffer,
    ) -> StartedChain | None:
        raise _unsupported(self, "schedules (take_schedule_tick)")

    async def schedule_ticks(self, names: Sequence[str]) -> Mapping[str, datetime]:
        raise _unsupported(self, "schedules (schedule_ticks)")

    async def complete_and_acquire(
        self: StateAdapter,
        completions: Sequence[Completion],
        *,
        notes: NotificationBuffer,
        type_names: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
    ) -> tuple[list[JobOwnershipLostError | None], list[JobRecord]]:
        from state_adapters.errors import JobOwnershipLostError

        written = await self.complete_jobs(completions, notes=notes) if completions else []
        claimed = (
            await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
            if limit
            else []
        )
        lost = [r if isinstance(r, JobOwnershipLostError) else None for r in written]
        return lost, claimed

    async def queue_overview(
        self: StateAdapter, *, since: datetime, finished_limit: int = 100_000
    ) -> QueueOverview:
        # Without a per-type read: the totals of the unfinished jobs under one "*" row
        # and nothing about finished ones (an adapter's own method can do better).
        counts = await self.count_jobs()
        unfinished: dict[str, int] = {
            s: counts.get(s, 0) for s in UNFINISHED_STATUSES if counts.get(s)
        }
        return QueueOverview(
            since=since,
            unfinished={"*": unfinished} if unfinished else {},
            finished={},
            minutes=(),
            truncated=True,
        )

    async def find_chains(
        self: StateAdapter,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        search: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        if search is None:
            return await self.list_chains(
                status=status, type_name=type_name, limit=limit, after=after
            )
        # Without a search index: the chain of that id only.
        found = [
            chain
            for chain in await self.get_chains([search])
            if (status is None or chain.status == status)
            and (type_name is None or chain.type_name == type_name)
            and (after is None or chain.id < after)
        ]
        return Page(found[:limit])

    async def chain_links(self, chain_id: str, *, limit: int = 100) -> ChainLinks:
        return ChainLinks(blocked_by=(), blocking=())


def _unsupported(adapter: object, feature: str) -> Exception:
    from state_adapters.errors import ConfigurationError

    return ConfigurationError(
        f"{type(adapter).__name__} does not support {feature}: implement it (see "
        "state_adapters.protocol.StateAdapter) or use SqlAlchemyStateAdapter"
    )


@asynccontextmanager
async def _nothing_held() -> AsyncIterator[None]:
    yield
