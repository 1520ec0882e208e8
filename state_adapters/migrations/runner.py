"""Applies the shipped migrations to one table set, on a connection the caller holds.

Alembic runs with ``script_location = "state_adapters:migrations"`` and a
version table of the table set's own (``{prefix}alembic_version``), so it never
touches the application's own Alembic history. The table prefix and schema
reach the revision scripts as the ``tables`` keyword of ``upgrade()``.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

from state_adapters.schema import Tables

SCRIPT_LOCATION = "state_adapters:migrations"


def config_for(connection: Connection, tables: Tables) -> Config:
    """An in-memory Alembic config bound to ``connection`` and ``tables``."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    config.attributes["tables"] = tables
    return config


def upgrade(connection: Connection, tables: Tables) -> None:
    """Bring ``tables`` to the newest revision inside the connection's transaction
    (which the caller commits); a no-op when they are already there."""
    command.upgrade(config_for(connection, tables), "head")
