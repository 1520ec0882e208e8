"""A worker's settings, checked once when the worker is built."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from queuert_notify.errors import InvalidInputError
from queuert_notify.job_logs.attempt_log import DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES
from queuert_notify.maintenance.pruner import check_retention
from queuert_notify.maintenance.schedules import Schedule, check_schedules
from state_adapters.validation import check_positive_int, check_seconds

WorkerMode = Literal["atomic", "staged"]


@dataclass(frozen=True)
class WorkerSettings:
    """The keyword arguments of :class:`~queuert_notify.worker.worker.Worker`, valid by
    construction: a bad value is an ``InvalidInputError`` naming the setting, raised
    before the worker exists. An empty ``worker_id`` becomes a random one.

    ``poll_interval``: seconds between SQL polls when no hint arrives (± ``jitter`` as a
    fraction); ``lease``: seconds a claim lasts without renewal (renewed every third of
    it); ``handler_timeout``: seconds after which a handler's attempt fails;
    ``retry_backoff(attempt) -> seconds`` overrides the state adapter's capped
    exponential backoff; ``reap_interval``: how often an idle worker returns expired
    leases to pending (default ``lease / 2``); ``loop_lag_threshold``: seconds the event
    loop may be blocked before a warning names the running jobs (``None``: no
    watchdog); ``schedules``: :class:`Schedule` s whose chains this worker starts, one
    per tick across all workers; ``retention``: delete chains that finished longer ago
    than this (``None``: keep them) -- see docs/operations.md; ``startup_timeout``:
    seconds ``run()`` waits for a database that does not answer before its one-line
    ``ConfigurationError`` (see docs/workers.md); ``job_log_lines`` /
    ``job_log_bytes``: ``ctx.log`` lines kept per attempt (docs/workers.md);
    ``claim_ahead``: while a backlog drains (the last claim was full), a claim also takes
    up to ``concurrency`` jobs ahead of the free slots, leased and renewed while they wait
    in this worker -- fewer claim round trips (in the last measurement no faster a drain
    of no-op jobs: docs/benchmarks.md), but jobs waiting here are not run by an idle
    worker elsewhere, so leave it off for long jobs."""

    concurrency: int = 10
    poll_interval: float = 60.0
    lease: float = 60.0
    mode: WorkerMode = "atomic"
    worker_id: str = ""
    handler_timeout: float | None = None
    retry_backoff: Callable[[int], float] | None = None
    drain_timeout: float = 30.0
    reap_interval: float | None = None
    jitter: float = 0.1
    completion_batch_size: int = 100
    completion_linger: float = 0.0
    loop_lag_threshold: float | None = 0.5
    schedules: tuple[Schedule, ...] = ()
    retention: timedelta | None = None
    startup_timeout: float = 30.0
    job_log_lines: int = DEFAULT_MAX_LINES
    job_log_bytes: int = DEFAULT_MAX_BYTES
    claim_ahead: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.concurrency, "concurrency")
        check_seconds(self.poll_interval, "poll_interval", allow_zero=False)
        check_seconds(self.lease, "lease", allow_zero=False)
        check_seconds(self.drain_timeout, "drain_timeout", allow_zero=True)
        check_seconds(self.startup_timeout, "startup_timeout", allow_zero=True)
        check_positive_int(self.completion_batch_size, "completion_batch_size")
        check_positive_int(self.job_log_lines, "job_log_lines")
        check_positive_int(self.job_log_bytes, "job_log_bytes")
        if self.handler_timeout is not None:
            check_seconds(self.handler_timeout, "handler_timeout", allow_zero=False)
        if self.reap_interval is not None:
            check_seconds(self.reap_interval, "reap_interval", allow_zero=False)
        if self.loop_lag_threshold is not None:
            check_seconds(self.loop_lag_threshold, "loop_lag_threshold", allow_zero=False)
        if not 0 <= self.jitter < 1:
            raise InvalidInputError(f"jitter must be a fraction in [0, 1), got {self.jitter!r}")
        if self.retry_backoff is not None and not callable(self.retry_backoff):
            raise InvalidInputError(
                f"retry_backoff must be a callable attempt -> seconds, got {self.retry_backoff!r}"
            )
        if self.mode not in ("atomic", "staged"):
            raise InvalidInputError(f"mode must be 'atomic' or 'staged', got {self.mode!r}")
        check_schedules(self.schedules)
        check_retention(self.retention)
        if not self.worker_id:
            # Frozen: the one default drawn at random is set once, here.
            object.__setattr__(self, "worker_id", f"worker-{uuid.uuid4().hex[:12]}")

    @property
    def reap_every(self) -> float:
        """Seconds between reaps of an idle worker: ``reap_interval``, by default half
        the lease."""
        return self.reap_interval if self.reap_interval is not None else self.lease / 2
