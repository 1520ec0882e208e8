"""The lines of one attempt of a job, collected in memory until they are written, and
the ``logging.Handler`` that routes a handler's ordinary log records to them."""

from __future__ import annotations

import json
import logging
import threading
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from state_adapters.model import JobLogLine

DEFAULT_MAX_LINES = 1000
"""Lines kept per attempt by default (``Worker(job_log_lines=...)``)."""
DEFAULT_MAX_BYTES = 256 * 1024
"""Bytes of messages and fields kept per attempt by default (``Worker(job_log_bytes=...)``)."""

_FORMATTER = logging.Formatter()

running_attempt: ContextVar[AttemptLog | None] = ContextVar("queuert_running_attempt", default=None)
"""The log of the attempt whose handler runs in this context (a plain ``def`` handler's
thread inherits it)."""


class AttemptLog:
    """The lines one attempt logs, numbered ``seq`` 1, 2, ... in the order they came.

    Invariants: :meth:`add` never blocks on the database and never raises (it may be
    called from the handler's thread); at most ``max_lines`` lines and ``max_bytes``
    bytes (message plus JSON fields) are kept, the rest counted, and :meth:`finish` adds
    one marker line saying how many were dropped; each line is handed out once, by
    :meth:`take` or :meth:`finish`; nothing is added after :meth:`finish`.
    """

    def __init__(self, job_id: str, attempt: int, *, max_lines: int, max_bytes: int) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._unwritten: list[JobLogLine] = []
        self._kept = 0
        self._bytes = 0
        self.dropped = 0
        self._finished = False

    def add(self, level: str, message: str, fields: dict[str, Any] | None = None) -> None:
        """Keep one line, or count it as dropped once the attempt's bound is reached."""
        # Postgres holds no NUL in text or jsonb: a line must never fail the completion
        # it is written with.
        message = message.replace("\x00", "\ufffd")
        stored: dict[str, Any] | None = None
        size = len(message.encode("utf-8", "replace"))
        if fields:
            encoded = _encoded(fields)
            size += len(encoded)
            stored = json.loads(encoded)
        with self._lock:
            if self._finished:
                return
            if self._kept >= self._max_lines or self._bytes + size > self._max_bytes:
                self.dropped += 1
                return
            self._kept += 1
            self._bytes += size
            line = JobLogLine(self.job_id, self.attempt, self._kept, _now(), level, message, stored)
            self._unwritten.append(line)

    def take(self) -> list[JobLogLine]:
        """The lines not handed out yet (to write while the job runs)."""
        with self._lock:
            taken, self._unwritten = self._unwritten, []
        return taken

    def finish(self) -> list[JobLogLine]:
        """The last lines, with the marker of dropped lines if any (nothing on a second
        call); later lines are ignored."""
        with self._lock:
            if self._finished:
                return []
            self._finished = True
            taken, self._unwritten = self._unwritten, []
            if self.dropped:
                marker = f"{self.dropped} lines dropped (over {self._max_lines} lines or "
                marker += f"{self._max_bytes} bytes in this attempt)"
                taken.append(
                    JobLogLine(
                        self.job_id,
                        self.attempt,
                        self._kept + 1,
                        _now(),
                        "WARNING",
                        marker,
                        {"dropped": self.dropped},
                    )
                )
        return taken


class JobLogHandler(logging.Handler):
    """Records logged while a job's handler runs (in its task, or the thread of a plain
    ``def`` handler) become lines of that job's log; records logged anywhere else are
    ignored. Attach it once, e.g. ``logging.getLogger().addHandler(JobLogHandler())``.

    A line's message is the record's message (with the traceback of ``exc_info``); its
    fields name the logger."""

    def emit(self, record: logging.LogRecord) -> None:
        log = running_attempt.get()
        if log is None:
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{_FORMATTER.formatException(record.exc_info)}"
            log.add(record.levelname, message, {"logger": record.name})
        except Exception:
            self.handleError(record)


def _encoded(fields: dict[str, Any]) -> str:
    """``fields`` as JSON any database stores: values JSON cannot hold as their ``str()``,
    no NaN or infinity, no NUL."""
    try:
        encoded = json.dumps(fields, default=str, allow_nan=False)
    except ValueError:  # NaN or infinity, or a cycle
        encoded = json.dumps({"fields": repr(fields)})
    return encoded.replace("\\u0000", "\\ufffd")


def _now() -> datetime:
    return datetime.now(UTC)
