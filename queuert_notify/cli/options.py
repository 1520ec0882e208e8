"""Options several ``queuert-notify`` commands share: where the queue's tables are,
where to announce a change, and ``--json``."""

from __future__ import annotations

from collections.abc import Callable

import click

DATABASE_URL_ENV = "QUEUERT_DATABASE_URL"
DEFAULT_TABLE_PREFIX = "queuert_"

database_url_option = click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    required=True,
    help=f"SQLAlchemy URL of the job database (or ${DATABASE_URL_ENV}), e.g. "
    "postgresql+psycopg://user@host/db or sqlite+aiosqlite:///jobs.db",
)
table_prefix_option = click.option(
    "--table-prefix",
    default=DEFAULT_TABLE_PREFIX,
    show_default=True,
    help="Prefix of the queue's tables.",
)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON (every field, untruncated; times in ISO 8601 UTC) instead of tables.",
)


def redis_url_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--redis-url`` and ``--redis-prefix``: where to announce a change."""
    command = click.option(
        "--redis-prefix", default="queuert", show_default=True, help="The workers' Redis prefix."
    )(command)
    return click.option(
        "--redis-url",
        default=None,
        help="Redis to announce the change on (workers wake at once); without it they find "
        "it at their next poll.",
    )(command)
