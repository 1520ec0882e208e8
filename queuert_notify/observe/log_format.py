"""How ``queuert-notify`` writes its log: rich on a terminal, plain or JSON lines
elsewhere.

Off a terminal (a file, a pipe, a log collector) every record is one line that
is never wrapped to a terminal width; with ``json`` each line is an object that
also carries the record's ``extra`` keys (``job_id``, ``type_name``,
``attempt``, ``worker_id``...), so a collector can index them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
_PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (UTC, ISO 8601), ``level``,
    ``logger``, ``message``, every ``extra`` key, and ``exception`` (the traceback
    text) when there is one. Values JSON cannot hold are written as ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in record.__dict__.items() if k not in _STANDARD_FIELDS)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=_as_text)


def configure(level: int, log_format: LogFormat = "text") -> None:
    """Send the root logger's records at ``level`` to stderr in ``log_format``
    (replacing handlers configured before): ``text`` is rich on a terminal and
    plain unwrapped lines elsewhere; ``json`` is :class:`JsonLinesFormatter`."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLinesFormatter())
    elif sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_PLAIN))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _as_text(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
