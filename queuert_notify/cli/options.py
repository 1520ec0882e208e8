"""Options several ``queuert-notify`` commands share: where the queue's tables are,
where to announce a change, and ``--json``."""

from __future__ import annotations

from collections.abc import Callable

import click

DATABASE_URL_ENV = "QUEUERT_DATABASE_URL"
TABLE_PREFIX_ENV = "QUEUERT_TABLE_PREFIX"
REDIS_URL_ENV = "QUEUERT_REDIS_URL"
REDIS_PREFIX_ENV = "QUEUERT_REDIS_PREFIX"
DEFAULT_TABLE_PREFIX = "queuert_"
NEXT_POLL_NOTE = f"no --redis-url (or ${REDIS_URL_ENV}): workers see this change on their next poll"

database_url_option = click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    show_envvar=True,
    required=True,
    help="SQLAlchemy URL of the job database, e.g. "
    "postgresql+psycopg://user@host/db or sqlite+aiosqlite:///jobs.db",
)
table_prefix_option = click.option(
    "--table-prefix",
    envvar=TABLE_PREFIX_ENV,
    show_envvar=True,
    default=DEFAULT_TABLE_PREFIX,
    show_default=True,
    help="Prefix of the queue's tables.",
)
redis_prefix_option = click.option(
    "--redis-prefix",
    envvar=REDIS_PREFIX_ENV,
    show_envvar=True,
    default="queuert",
    show_default=True,
    help="The workers' Redis prefix.",
)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON (every field, untruncated; times in ISO 8601 UTC) instead of tables.",
)


def redis_url_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--redis-url`` and ``--redis-prefix``: where to announce a change."""
    return click.option(
        "--redis-url",
        envvar=REDIS_URL_ENV,
        show_envvar=True,
        default=None,
        help="Redis to announce the change on (workers wake at once); without it they find "
        "it at their next poll.",
    )(redis_prefix_option(command))


def note_next_poll(redis_url: str | None) -> None:
    """After a change: without Redis, one line (on stderr) saying when workers see it."""
    if redis_url is None:
        click.echo(NEXT_POLL_NOTE, err=True)
