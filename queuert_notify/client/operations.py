"""Operating the queue from a client: retention on demand, pausing and resuming a job
type, the limits every worker holds, and the health report
(:class:`~queuert_notify.Client` has these methods; see docs/operations.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

from queuert_notify.maintenance.prune_pacing import PrunePacing, prune_horizon
from state_adapters.health import HealthReport, HealthThresholds
from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE, TypeLimits, WorkerRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.validation import window_seconds

if TYPE_CHECKING:
    from state_adapters.protocol import CallerSession, StateAdapter

T = TypeVar("T")


class ClientCalls(Protocol):
    """What the operating methods use of the client: its state calls, retried after a
    lost connection, with notifications published after the COMMIT."""

    state: StateAdapter

    async def _retried(
        self,
        session: CallerSession,
        call: Callable[[], Awaitable[T]],
        *,
        again: Callable[[], Awaitable[T]] | None = None,
    ) -> T: ...

    async def _write(
        self,
        session: CallerSession,
        write: Callable[[NotificationBuffer], Awaitable[T]],
        *,
        again: Callable[[NotificationBuffer], Awaitable[T]] | None = None,
    ) -> T: ...


class QueueOperations:
    """The operating methods of :class:`~queuert_notify.Client`."""

    async def prune(
        self: ClientCalls, *, older_than: timedelta, batch_size: int = DEFAULT_PRUNE_BATCH_SIZE
    ) -> int:
        """Delete the chains that finished (completed, failed or cancelled) more than
        ``older_than`` ago, with their jobs; returns how many chains were deleted.

        In transactions of at most ``batch_size`` chains, oldest first, paced
        (:mod:`queuert_notify.maintenance.prune_pacing`): each batch is sized to hold its locks (on
        SQLite, the database) for about 5 ms, and after each one it waits twice as long
        as the batch took, so claims keep flowing. A chain that a job of an unfinished
        chain waits on is kept until that chain is final. Any number of
        callers (and workers with ``retention``) may prune at once: they never delete
        the same chains nor wait on each other's. Safe to repeat."""
        finished_before = prune_horizon(older_than, batch_size)
        loop = asyncio.get_running_loop()
        pacing = PrunePacing(batch_size)
        total = 0
        while True:
            started = loop.time()
            size = pacing.size
            prune_batch = partial(self.state.prune_chains, finished_before, batch_size=size)
            deleted = await self._retried(None, prune_batch)
            total += deleted
            if deleted < size:
                return total
            await asyncio.sleep(pacing.batch_took(loop.time() - started))

    async def pause_type(self: ClientCalls, type_name: str) -> None:
        """Stop every worker from claiming jobs of ``type_name``, including workers
        started later; running jobs finish. Stored in the database until
        :meth:`resume_type`. Safe to repeat."""
        await self._write(None, lambda notes: self.state.pause_type(type_name, notes=notes))

    async def resume_type(self: ClientCalls, type_name: str) -> None:
        """Let workers claim ``type_name`` again and wake idle ones at once (one
        ``notify_jobs_scheduled`` with its due jobs). Safe to repeat."""
        await self._write(None, lambda notes: self.state.resume_type(type_name, notes=notes))

    async def workers(self: ClientCalls) -> list[WorkerRecord]:
        """The workers recorded in the registry, oldest first: live ones beat within
        ``WORKER_DEAD_AFTER`` seconds (``record.alive(now)``), dead ones stay listed
        for a day (see docs/operations.md, "Workers")."""
        return await self._retried(None, self.state.workers)

    async def paused_types(self: ClientCalls) -> set[str]:
        """The job types paused now."""
        return await self._retried(None, self.state.paused_types)

    async def set_limits(
        self: ClientCalls,
        type_name: str,
        *,
        concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate: int | None = None,
        per: timedelta | None = None,
    ) -> TypeLimits:
        """Set the limits of ``type_name``, held across every worker and process:
        ``concurrency`` running jobs of the type, ``key_concurrency`` running jobs per
        ``concurrency_key`` (see :meth:`start_chain`), ``rate`` jobs started per ``per``
        in any window of that length. Every call replaces all four; ``None`` lifts a
        limit (no arguments: none). Workers follow within a second. Bad values raise
        ``InvalidInputError`` before anything is written. Safe to repeat."""
        seconds = window_seconds(per)
        return await self._write(
            None,
            lambda notes: self.state.set_limits(
                type_name,
                concurrency=concurrency,
                key_concurrency=key_concurrency,
                rate=rate,
                per_seconds=seconds,
                notes=notes,
            ),
        )

    async def health(
        self: ClientCalls, *, thresholds: HealthThresholds | None = None
    ) -> HealthReport:
        """The queue's health as its database sees it: dead row versions and vacuum of
        the queue's tables, the transactions, prepared transactions and replication slots
        holding back the xmin horizon (Postgres), the WAL (SQLite), the due backlog and
        leases that ran out. Each finding has a severity (``ok``, ``warning``,
        ``critical``), what it means for the queue and what to do; ``report.severity`` is
        the worst. ``thresholds`` sets when a reading becomes a finding (by default a
        transaction is one from 60 s on). Reads only; a few milliseconds whatever the
        table's size."""
        return await self._retried(None, lambda: self.state.health(thresholds=thresholds))
