"""Logging a dependency that keeps failing, once per outage rather than once per call."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

WARNING_INTERVAL = 10.0
"""While calls keep failing, at most one warning per this many seconds; the failures in
between are counted in the next one and logged at DEBUG."""


class OutageLog:
    """Logs the failures of one kind of call to one dependency (a notify server) so an
    outage costs a few log lines instead of a traceback per call, which would cost more
    CPU than the jobs themselves.

    Invariant: at most one WARNING per ``interval`` seconds while calls fail (the first
    failure of an outage is always warned about, with its traceback unless
    ``tracebacks`` is false: then each warning names the error in its line and the
    tracebacks are logged at DEBUG); the first success after a warning logs one INFO
    line saying the calls work again.
    """

    __slots__ = (
        "_interval",
        "_last_warning",
        "_logger",
        "_outage",
        "_tracebacks",
        "_unreported",
        "_what",
    )

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        interval: float = WARNING_INTERVAL,
        tracebacks: bool = True,
    ) -> None:
        self._logger = logger
        self._what = what
        self._interval = interval
        self._tracebacks = tracebacks
        self._unreported = 0
        self._last_warning = float("-inf")
        self._outage = False

    def failed(self, consequence: str, **extra: Any) -> None:
        """Record a failure of the call (from inside the ``except`` block)."""
        now = time.monotonic()
        if now - self._last_warning < self._interval:
            self._unreported += 1
            self._logger.debug("%s failed", self._what, exc_info=True, extra=extra)
            return
        since = f" ({self._unreported} more since the last warning)" if self._unreported else ""
        error = ""
        if not self._tracebacks:
            self._logger.debug("%s failed", self._what, exc_info=True, extra=extra)
            error = f": {_one_line(sys.exc_info()[1])}"
        self._logger.warning(
            "%s failed%s%s; %s",
            self._what,
            since,
            error,
            consequence,
            exc_info=self._tracebacks and not self._outage,
            extra=extra,
        )
        self._last_warning, self._unreported, self._outage = now, 0, True

    def succeeded(self) -> None:
        """Record a success: ends the outage, if there was one."""
        if self._outage:
            self._outage = False
            self._last_warning, self._unreported = float("-inf"), 0
            self._logger.info("%s works again", self._what)


def _one_line(error: BaseException | None) -> str:
    """``Type: message``, its first line only (a driver's message may go on for lines)."""
    if error is None:
        return "unknown error"
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
