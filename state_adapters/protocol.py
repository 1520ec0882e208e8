"""The state seam: everything the client and workers need from durable job storage.

Every mutating method accepts the caller's ``AsyncSession`` or
``AsyncConnection`` as ``session`` and then writes inside the caller's
transaction without committing it; without one, the adapter opens, commits and
closes its own transaction before returning. The notifications a change
implies are recorded into ``notes`` (a :class:`NotificationBuffer`) and sent by
the caller only after the transaction commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from state_adapters.model import (
    DEFAULT_PRUNE_BATCH_SIZE,
    ChainLinks,
    ChainRecord,
    Completion,
    FailureOutcome,
    JobLogLine,
    JobRecord,
    JobStatus,
    LogPosition,
    NewChain,
    Page,
    QueueOverview,
    StartedChain,
    TypeLimits,
    WorkerRecord,
)

# Only type-checking imports from queuert_notify: it imports this module at
# runtime, so a runtime import back would be a cycle.
if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from state_adapters.errors import JobOwnershipLostError
    from state_adapters.health import HealthReport, HealthThresholds
    from state_adapters.notifications import NotificationBuffer
    from state_adapters.transactions.handler_transaction import HandlerTransaction

    CallerSession: TypeAlias = AsyncSession | AsyncConnection | None


class StateAdapter(Protocol):
    """Durable job state. See the module docstring for sessions and ``notes``."""

    @property
    def address(self) -> str:
        """Where the state is kept, for messages and logs (a URL's password masked)."""
        ...

    async def append_job_logs(self, lines: Sequence[JobLogLine]) -> None:
        """Write log lines (of any jobs) in a transaction of the adapter's own, kept
        whatever becomes of the jobs' transactions. A job's last lines go with its
        ``Completion.log_lines`` instead (written only if the completion holds)."""
        ...

    async def job_logs(
        self, job_id: str, *, after: LogPosition | None = None, session: CallerSession = None
    ) -> list[JobLogLine]:
        """The job's log lines by attempt then ``seq``, those after ``(attempt, seq)`` if
        given; none (not an error) for an unknown job."""
        ...

    async def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the schema; idempotent and safe to run concurrently.
        ``adopt``: take over matching tables created by someone else."""
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

    async def database_time(self) -> datetime:
        """The current instant on the clock every worker shares (the database's): the
        schedules' ticks are decided on it, so a worker whose own clock is wrong cannot
        take a tick early or hold one back."""
        ...

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

    # -- the worker registry (state_adapters.steps.operations) ------------------------------

    async def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        type_names: Sequence[str],
        slots: int,
        starting: bool = False,
    ) -> None:
        """Write the worker's row with a fresh heartbeat (one write); ``starting``
        (re)creates it."""
        ...

    async def forget_worker(self, worker_id: str) -> None:
        """Delete the worker's row (a clean stop)."""
        ...

    async def workers(self) -> list[WorkerRecord]:
        """Every recorded worker, live or dead, oldest first."""
        ...

    async def due_jobs_by_type(self) -> Mapping[str, int]:
        """Pending jobs due now, per type that has some."""
        ...

    async def health(
        self, *, thresholds: HealthThresholds | None = None, session: CallerSession = None
    ) -> HealthReport:
        """The queue's health as its database sees it (:mod:`state_adapters.health`)."""
        ...

    # -- what a worker's loop uses ---------------------------------------------------

    @property
    def completes_with_claims(self) -> bool:
        """Whether a worker should hand the completions waiting to be written to its
        next claim (:meth:`complete_and_acquire`) rather than write them alongside it."""
        ...

    def holding_connections(self) -> AbstractAsyncContextManager[None]:
        """While open, the calls a worker repeats may keep connections out of the pool;
        leaving the last hold gives back every connection kept (``Client.close()``)."""
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
