"""Writing the lines of a worker's running jobs: all of them in one batch at most
``interval`` seconds apart, each batch one transaction of its own."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from queuert_notify.job_logs.attempt_log import AttemptLog
from state_adapters.model import JobLogLine
from state_adapters.protocol import StateAdapter

if TYPE_CHECKING:
    from queuert_notify.worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0
"""Seconds a line of a running job waits at most before its batch is written."""


class JobLogWriter:
    """Writes the lines of the attempts :meth:`open` registered, every ``interval``
    seconds, all attempts in one write; an attempt's last lines are handed back by
    :meth:`close_attempt` to go with its outcome.

    Invariants: a line is written at most once; a write that fails loses its lines
    (logged with their number) and never fails a job; no database call runs in a
    handler's path; between writes it holds one timer of the event loop, armed by
    :meth:`open` and kept while attempts are open (once it finds none it is not armed
    again, so it outlives the last attempt by at most ``interval`` and then does
    nothing), and a write runs in a task of its own that ends with it. An attempt's last
    lines may commit before a batch of its earlier ones still in flight: readers order
    by ``seq``.

    A timer rather than a sleeping task, left armed rather than cancelled when no
    attempt is open: a worker at work opens and closes attempts all the time, most of
    them writing no line early, and the set of open attempts empties between claims.
    """

    def __init__(
        self, state: StateAdapter, settings: WorkerSettings, *, interval: float = FLUSH_INTERVAL
    ) -> None:
        self._state = state
        self._max_lines = settings.job_log_lines
        self._max_bytes = settings.job_log_bytes
        self._interval = interval
        self._open: set[AttemptLog] = set()
        self._writing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def open(self, job_id: str, attempt: int) -> AttemptLog:
        """A new attempt's log, written by this writer until :meth:`close_attempt`."""
        log = AttemptLog(job_id, attempt, max_lines=self._max_lines, max_bytes=self._max_bytes)
        self._open.add(log)
        if self._timer is None and self._writing is None:
            self._arm()
        return log

    def close_attempt(self, log: AttemptLog) -> list[JobLogLine]:
        """The attempt's lines not handed out yet (and its marker of dropped lines), to go
        with its outcome. Never waits for a write in flight: on SQLite that write may wait
        for the write lock the attempt's own transaction holds."""
        self._open.discard(log)
        return log.finish()

    async def write(self, lines: list[JobLogLine]) -> None:
        """Write ``lines`` now, in a transaction of their own (the lines of an attempt
        that did not complete); a failure is logged, never raised."""
        if not lines:
            return
        try:
            await self._state.append_job_logs(lines)
        except Exception:
            logger.warning(
                "writing job log lines failed; %d lines lost",
                len(lines),
                exc_info=True,
                extra={"job_ids": sorted({line.job_id for line in lines})},
            )

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._due)

    def _due(self) -> None:
        self._timer = None
        lines = [line for log in list(self._open) for line in log.take()]
        if lines:
            self._writing = asyncio.create_task(
                self._write_due(lines), name="queuert-job-log-writer"
            )
        elif self._open:
            self._arm()

    async def _write_due(self, lines: list[JobLogLine]) -> None:
        try:
            await self.write(lines)
        finally:
            self._writing = None
            if self._open and self._timer is None:
                self._arm()
