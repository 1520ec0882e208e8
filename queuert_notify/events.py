"""What a worker reports to ``Worker(on_event=...)`` while it runs jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from queuert_notify.jobs import Job

logger = logging.getLogger(__name__)

EventKind = Literal[
    "started",
    "completed",
    "retried",
    "failed",
    "ownership_lost",
    "abandoned",
    "reaped",
    "progress",
    "loop_blocked",
]
"""
- ``started``: the handler is about to run (``attempt`` counts from 1);
- ``completed``: the completion (and any continuation) committed;
- ``retried``: the attempt failed and the job is pending again at ``retry_at``;
- ``failed``: the attempt failed and no attempts are left (the chain failed);
- ``ownership_lost``: the worker lost the job (lease reaped, chain cancelled or completed
  elsewhere); the handler was cancelled and nothing it returns is written;
- ``abandoned``: the worker stopped (drain timeout, forced stop) before the handler
  finished; the handler was cancelled and the job runs again once its lease expires;
- ``reaped``: this worker returned another worker's expired job to pending (or failed);
  only ``job_id`` is known;
- ``progress``: the handler stored ``progress`` with ``ctx.set_progress``;
- ``loop_blocked``: the worker's event loop was blocked for ``lag`` seconds (a handler
  doing blocking work in an ``async def``); not about one job: ``job_id`` is empty and
  ``job_ids`` lists the jobs that were running meanwhile.
"""


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """One thing that happened to one job on one worker. Delivered on the event loop;
    a callback that raises is logged and never affects the job."""

    kind: EventKind
    job_id: str
    worker_id: str
    type_name: str | None = None
    chain_id: str | None = None
    attempt: int | None = None
    error: str | None = None
    """``retried``/``failed``: the error recorded; ``ownership_lost``: why."""
    retry_at: datetime | None = None
    progress: Any = None
    continued_with: str | None = None
    """``completed`` by ``continue_with``: the type name of the chain's next job."""
    at: float = field(default=0.0)
    """``time.time()`` when the event happened."""
    lag: float | None = None
    """``loop_blocked``: seconds the event loop was blocked beyond a short sleep."""
    job_ids: tuple[str, ...] = ()
    """``loop_blocked``: the jobs running on this worker while the loop was blocked."""


class EventEmitter:
    """Builds a worker's events and hands them to its ``on_event`` callback (``None``:
    nothing is built); a callback that raises is logged and changes nothing."""

    def __init__(self, on_event: Callable[[WorkerEvent], object] | None, *, worker_id: str) -> None:
        self._on_event = on_event
        self._worker_id = worker_id

    def __call__(
        self, kind: EventKind, job: Job | None = None, *, job_id: str | None = None, **details: Any
    ) -> None:
        if self._on_event is None:
            return
        # Positional where it can be, in the order of the fields: two events per job.
        if job is not None:
            event = WorkerEvent(
                kind,
                job.id,
                self._worker_id,
                job.type_name,
                job.chain_id,
                job.attempt,
                at=time.time(),
                **details,
            )
        else:
            event = WorkerEvent(kind, job_id or "", self._worker_id, at=time.time(), **details)
        try:
            self._on_event(event)
        except Exception:
            logger.exception("on_event callback failed", extra={"event_kind": kind})
