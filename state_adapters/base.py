"""Defaults for the optional capabilities of the state seam
(:class:`~state_adapters.protocol.StateAdapter`): what an adapter of a user's own inherits
until it implements a faster or fuller way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from state_adapters.model import (
    DEFAULT_PRUNE_BATCH_SIZE,
    UNFINISHED_STATUSES,
    ChainLinks,
    Completion,
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

if TYPE_CHECKING:
    from state_adapters.errors import JobOwnershipLostError
    from state_adapters.health import HealthReport
    from state_adapters.notifications import NotificationBuffer
    from state_adapters.protocol import CallerSession, StateAdapter
    from state_adapters.transactions.handler_transaction import HandlerTransaction


class StateAdapterBase:
    """Defaults for the worker-loop capabilities of :class:`StateAdapter`, for adapters
    without a faster way: completions and claims in separate calls, no connections
    kept; and for operating the queue: nothing is ever paused or limited, and pausing
    or setting limits raises ``ConfigurationError``; no log store (lines are not kept,
    and a job's log reads empty). Subclass it and implement the rest of the
    protocol."""

    @property
    def address(self) -> str:
        return type(self).__name__

    async def append_job_logs(self, lines: Sequence[JobLogLine]) -> None:
        return None

    async def job_logs(
        self, job_id: str, *, after: LogPosition | None = None, session: CallerSession = None
    ) -> list[JobLogLine]:
        return []

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
        return None  # no registry: workers are not listed

    async def forget_worker(self, worker_id: str) -> None:
        return None

    async def workers(self) -> list[WorkerRecord]:
        return []

    async def due_jobs_by_type(self) -> Mapping[str, int]:
        return {}

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
        from state_adapters.steps.job_counts import from_status_counts

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

    async def database_time(self) -> datetime:
        # No shared clock known: this process's.
        return datetime.now(UTC)

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

    async def health(self: StateAdapter, **_: Any) -> HealthReport:
        from state_adapters.steps.health import counts_only

        return await counts_only(self)


def _unsupported(adapter: object, feature: str) -> Exception:
    from state_adapters.errors import ConfigurationError

    return ConfigurationError(
        f"{type(adapter).__name__} does not support {feature}: implement it (see "
        "state_adapters.protocol.StateAdapter) or use SqlAlchemyStateAdapter"
    )


@asynccontextmanager
async def _nothing_held() -> AsyncIterator[None]:
    yield
