"""``queuert-notify migrate``: create or upgrade the queue's tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from queuert_notify.cli.database import with_state
from queuert_notify.cli.options import database_url_option, table_prefix_option
from queuert_notify.cli.output import console, run
from queuert_notify.errors import mask_url

if TYPE_CHECKING:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


@click.command()
@database_url_option
@table_prefix_option
@click.option(
    "--adopt",
    is_flag=True,
    help="Take over queue tables your application's own Alembic created: check that "
    "they match this version's schema, then record that version (changes no table).",
)
def migrate(database_url: str, table_prefix: str, adopt: bool) -> None:
    """Create or upgrade the queue's tables (idempotent)."""

    async def go(state: SqlAlchemyStateAdapter) -> None:
        await state.migrate(adopt=adopt)

    run(with_state(database_url, table_prefix, go, create=True))
    console().print(f"migrated {mask_url(database_url)} (table prefix {table_prefix!r})")
