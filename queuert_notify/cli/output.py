"""How ``queuert-notify`` prints: a console sized for where the output goes, records as
JSON, times and values shortened for tables, and the library's typed errors as one line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from queuert_notify.errors import QueuertError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

T = TypeVar("T")

_UNFOLDED_WIDTH = 10_000


def run(coro: Awaitable[T]) -> T:
    """Run ``coro``; turn the library's typed errors into a one-line CLI error."""

    async def until_done() -> T:
        return await coro

    try:
        return asyncio.run(until_done())
    except QueuertError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def console() -> Console:
    """A console for one print: created per use, so the terminal width (or $COLUMNS) is
    read when printing."""
    # Imported on the first print: a command's --json output needs no rich (its
    # console and tables are ~100 M instructions to import).
    from rich.console import Console

    # No markup and no emoji codes: what is printed is data (a stored value's "[/x]"
    # would stop the command with rich's MarkupError, its ":name:" would turn into an
    # emoji); emphasis is styled text (:func:`line`). Rich's table of emoji codes, ~4 %
    # of its import, so stays unloaded.
    terminal = Console(emoji=False, markup=False)
    if not terminal.is_terminal and "COLUMNS" not in os.environ:
        # Into a file or a pipe: lines as long as they need, not folded at 80 columns.
        return Console(width=_UNFOLDED_WIDTH, emoji=False, markup=False)
    return terminal


def line(*parts: str | tuple[str, str]) -> Text:
    """A line to print: each part as it is, a ``(text, style)`` pair styled (``"bold"``)."""
    from rich.text import Text

    return Text.assemble(*parts)


def titled_table(title: str) -> Table:
    """An empty table, to print with :func:`console` (rich imported on first use)."""
    from rich.table import Table

    return Table(title=title)


def record(row: Any) -> dict[str, Any]:
    """A chain or job record as a dict, without lease tokens (they fence a worker's
    writes; nobody reading a listing needs them)."""
    data: dict[str, Any] = dataclasses.asdict(row)
    for item in (data, data.get("last_job") or {}):
        item.pop("lease_token", None)
    return data


def to_json(value: Any) -> str:
    """``value`` as indented JSON, times in ISO 8601."""
    return json.dumps(value, indent=2, default=json_value)


def json_value(value: Any) -> str:
    """A JSON value for what ``json`` cannot encode: times in ISO 8601, the rest as text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def when(moment: Any) -> str:
    """UTC, to the second, without the offset (every stored time is UTC)."""
    if moment is None:
        return "-"
    return str(moment.strftime("%Y-%m-%d %H:%M:%S"))


def short(value: Any, limit: int = 60) -> str:
    """``value`` as JSON, cut to ``limit`` characters for a table cell."""
    if value is None:
        return "-"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
