"""Applies the shipped migrations to one table set, on a connection the caller holds.

Alembic runs with ``script_location = "state_adapters:migrations"`` and a
version table of the table set's own (``{prefix}alembic_version``), so it never
touches the application's own Alembic history. The table prefix and schema
reach the revision scripts as the ``tables`` keyword of ``upgrade()``.

Tables that exist without that version table were created by someone else
(typically the application's own Alembic, from ``make_metadata``): they are
adopted only when asked to, and only when they match the newest revision.
"""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, inspect
from sqlalchemy.engine import Connection

from state_adapters.errors import ConfigurationError
from state_adapters.schema import JsonDocument, Tables

SCRIPT_LOCATION = "state_adapters:migrations"
TABLES_REVISION = "0006"
"""The newest revision that changed the tables (keep it so): adopted tables that match
the newest schema are stamped with it, then the later revisions run (0007: the
Postgres function of limited claims; 0008: the tables' autovacuum settings; 0009 and
0010 find their tables there; 0011 rebuilds SQLite tables whose JSON columns are still
declared ``JSON``)."""


def config_for(connection: Connection, tables: Tables) -> Config:
    """An in-memory Alembic config bound to ``connection`` and ``tables``."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    config.attributes["tables"] = tables
    return config


def upgrade(connection: Connection, tables: Tables, *, adopt: bool = False) -> None:
    """Bring ``tables`` to the newest revision inside the connection's transaction
    (which the caller commits); a no-op when they are already there.

    Queue tables that exist without the version table raise
    :class:`ConfigurationError`, unless ``adopt``: then, if they match the newest
    revision exactly, the version table is created and stamped with
    :data:`TABLES_REVISION`, and the revisions after it add what is not a table (the
    only table change: 0011 declares SQLite's JSON columns ``TEXT`` where an older
    ``make_metadata`` declared them ``JSON``); if they differ, the differences are the
    error.
    """
    config = config_for(connection, tables)
    db = inspect(connection)
    if not db.has_table(tables.version_table, schema=tables.schema):
        found = sorted(
            t.name for t in tables.metadata.sorted_tables if db.has_table(t.name, schema=t.schema)
        )
        if found and not adopt:
            raise ConfigurationError(
                f"the queue's tables {', '.join(found)} exist but migrate() did not create "
                f"them (there is no {tables.version_table} table); if your application's "
                "Alembic created them, run `queuert-notify migrate --adopt` (or "
                "`await state.migrate(adopt=True)`) once to check and take them over"
            )
        if found:
            differences = schema_differences(connection, tables)
            if differences:
                raise ConfigurationError(
                    f"cannot adopt the queue's tables: they differ from this version's "
                    f"schema ({'; '.join(differences)}); bring them in line first"
                )
            # The later revisions add what tables do not show (Postgres functions).
            command.stamp(config, TABLES_REVISION)
    command.upgrade(config, "head")


def schema_differences(connection: Connection, tables: Tables) -> list[str]:
    """What Alembic's autogenerate would change to turn the database's queue tables
    into ``tables`` (types included), one short line per change; empty when equal."""
    ours = {t.name for t in tables.metadata.sorted_tables}

    def include_name(name: str | None, kind: str, _parents: Any) -> bool:
        if kind == "schema":
            return name == tables.schema
        return kind != "table" or name in ours

    context = MigrationContext.configure(
        connection,
        opts={
            "compare_type": _compare_type,
            "include_schemas": tables.schema is not None,
            "include_name": include_name,
        },
    )
    return [_describe(diff) for diff in compare_metadata(context, tables.metadata)]


def _compare_type(
    context: MigrationContext,
    inspected_column: Any,
    metadata_column: Any,
    inspected_type: Any,
    metadata_type: Any,
) -> bool | None:
    """Alembic's comparison (``None``), but for a JSON column SQLite declares ``JSON``
    (``make_metadata`` before migration 0011): no difference, as 0011 runs after the
    stamp and rebuilds its table."""
    if (
        context.dialect.name == "sqlite"
        and isinstance(metadata_type, JsonDocument)
        and isinstance(inspected_type, JSON)
    ):
        return False
    return None


def _describe(diff: Any) -> str:
    """One short phrase per change, naming the table and column: Alembic gives a
    column's changes as a list of tuples that end in what the database has and what the
    schema wants (``modify_type``, ``modify_nullable``, ...), the others as a kind and
    the object it concerns."""
    if isinstance(diff, list):
        return "; ".join(_describe_column_change(*change) for change in diff)
    kind, *objects = diff
    if kind in ("add_column", "remove_column"):
        _schema, table, column = objects
        return f"{kind} {table}.{column.name}"
    return f"{kind} {getattr(objects[0], 'name', objects[0])}"


def _describe_column_change(
    kind: str, _schema: Any, table: str, column: str, _existing: Any, found: Any, wanted: Any
) -> str:
    what = kind.removeprefix("modify_")
    return f"{table}.{column}: {what} {found} in the database, {wanted} in the schema"
