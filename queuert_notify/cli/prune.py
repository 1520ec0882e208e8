"""``queuert-notify prune --older-than 7d``: retention on demand."""

from __future__ import annotations

import re
from datetime import timedelta

import click

from queuert_notify.cli.database import with_client
from queuert_notify.cli.options import database_url_option, table_prefix_option
from queuert_notify.cli.output import run

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"1d12h"``, ``"90m"``, ``"30s"``, ``"2w"`` as a timedelta."""
    compact = text.replace(" ", "").lower()
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise click.BadParameter(
            param_hint="--older-than",
            message=f"{text!r} is not a duration: use a number and a unit s, m, h, d or w, "
            "e.g. 7d, 12h, 1d12h, 90m",
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


@click.command("prune")
@database_url_option
@table_prefix_option
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Delete chains that finished longer ago than this: 7d, 12h, 1d12h, 90m, 30s, 2w.",
)
@click.option(
    "--batch-size",
    default=500,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Chains deleted per transaction.",
)
def prune_command(database_url: str, table_prefix: str, older_than: str, batch_size: int) -> None:
    """Delete finished chains (completed, failed, cancelled) older than --older-than,
    with their jobs, in paced batches; chains that unfinished chains wait on are kept."""
    window = parse_duration(older_than)
    no_notify = (None, "queuert")
    deleted = run(
        with_client(
            database_url,
            table_prefix,
            no_notify,
            lambda client: client.prune(older_than=window, batch_size=batch_size),
        )
    )
    click.echo(f"deleted {deleted} finished chain{'s' if deleted != 1 else ''} older than {window}")
