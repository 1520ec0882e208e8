"""Operating the queue from a :class:`~queuert_notify.SyncClient`: the same retention,
pausing and limits as :class:`~queuert_notify.client.operations.QueueOperations`, on
the caller's thread (see docs/operations.md)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from queuert_notify.maintenance.prune_pacing import PrunePacing, prune_horizon
from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE, TypeLimits, WorkerRecord
from state_adapters.validation import window_seconds

if TYPE_CHECKING:
    from state_adapters.notifications import NotificationBuffer
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
    from state_adapters.sync.bridge import SyncConnection
    from state_adapters.sync.state import Announcer, SyncStateAdapter


class SyncQueueOperations:
    """The operating methods of :class:`~queuert_notify.SyncClient`; each runs in a
    transaction of its own, like the async client's."""

    _state: SyncStateAdapter
    _announcer: Announcer

    def prune(self, *, older_than: timedelta, batch_size: int = DEFAULT_PRUNE_BATCH_SIZE) -> int:
        """Delete the chains that finished more than ``older_than`` ago, with their jobs,
        in paced batches; returns how many chains were deleted (as
        :meth:`Client.prune <queuert_notify.Client.prune>`)."""
        finished_before = prune_horizon(older_than, batch_size)
        pacing = PrunePacing(batch_size)
        total = 0
        while True:
            started = time.monotonic()
            size = pacing.size
            deleted = self._state.write(
                None,
                self._announcer,
                partial(_prune_batch, finished_before, size),
            )
            total += deleted
            if deleted < size:
                return total
            time.sleep(pacing.batch_took(time.monotonic() - started))

    def pause_type(self, type_name: str) -> None:
        """Stop every worker from claiming jobs of ``type_name`` until
        :meth:`resume_type`; running jobs finish. Safe to repeat."""
        self._state.write(
            None,
            self._announcer,
            lambda state, conn, notes: state.pause_type(type_name, notes=notes, session=conn),
        )

    def resume_type(self, type_name: str) -> None:
        """Let workers claim ``type_name`` again and wake idle ones. Safe to repeat."""
        self._state.write(
            None,
            self._announcer,
            lambda state, conn, notes: state.resume_type(type_name, notes=notes, session=conn),
        )

    def workers(self) -> list[WorkerRecord]:
        """The workers recorded in the registry, oldest first (see
        :meth:`Client.workers <queuert_notify.Client.workers>`)."""
        return self._state.read(None, lambda state, conn, _: state.workers(session=conn))

    def paused_types(self) -> set[str]:
        """The job types paused now."""
        return self._state.read(None, lambda state, conn, _: state.paused_types(session=conn))

    def set_limits(
        self,
        type_name: str,
        *,
        concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate: int | None = None,
        per: timedelta | None = None,
    ) -> TypeLimits:
        """Replace the limits of ``type_name`` (``None`` lifts one), as
        :meth:`Client.set_limits <queuert_notify.Client.set_limits>`."""
        seconds = window_seconds(per)
        return self._state.write(
            None,
            self._announcer,
            lambda state, conn, notes: state.set_limits(
                type_name,
                concurrency=concurrency,
                key_concurrency=key_concurrency,
                rate=rate,
                per_seconds=seconds,
                notes=notes,
                session=conn,
            ),
        )


async def _prune_batch(
    finished_before: datetime,
    size: int,
    state: SqlAlchemyStateAdapter,
    conn: SyncConnection,
    _notes: NotificationBuffer,
) -> int:
    return await state.prune_chains(finished_before, batch_size=size, session=conn)
