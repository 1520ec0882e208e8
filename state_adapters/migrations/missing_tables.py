"""A database whose queue tables were never migrated: one line that says so.

Without this, the first statement on such a database raises the driver's raw
"relation does not exist" (Postgres ``42P01``; ``42883`` for the function of limited
claims, which tables created by the application's own Alembic lack) or "no such
table" (SQLite),
with the statement's SQL attached. :func:`watch` turns exactly those errors,
when they name one of the watched queue tables, into a
:class:`ConfigurationError` that says to run ``migrate()``; any other error,
and a missing table of the application's own, passes through unchanged.
"""

from __future__ import annotations

import re
import weakref

from sqlalchemy import event
from sqlalchemy.engine import Dialect, Engine, ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine

from state_adapters.errors import ConfigurationError
from state_adapters.schema import Tables
from state_adapters.transactions.connection_loss import sqlstate_of

_UNDEFINED_TABLE = "42P01"
_UNDEFINED_FUNCTION = "42883"
_POSTGRES_NAME = re.compile(r'relation "([^"]+)" does not exist')
_POSTGRES_FUNCTION = re.compile(r"function ([^\s(]+)\(")
_SQLITE_NAME = re.compile(r"no such table: (\S+)")
# Queue table name -> its table prefix, per engine (keyed by its dialect, which the
# engine's execution-option views share).
_WATCHED: weakref.WeakKeyDictionary[Dialect, dict[str, str]] = weakref.WeakKeyDictionary()


def watch(engine: AsyncEngine | Engine, tables: Tables) -> None:
    """From now on, a statement on ``engine`` that fails because one of ``tables`` does
    not exist raises :func:`error`'s ConfigurationError instead (idempotent)."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    names = _WATCHED.setdefault(sync_engine.dialect, {})
    names.update((table.name, tables.table_prefix) for table in tables.metadata.sorted_tables)
    names[tables.claim_function] = tables.table_prefix
    if not event.contains(sync_engine, "handle_error", _on_error):
        event.listen(sync_engine, "handle_error", _on_error)


def error(dialect: Dialect, exc: BaseException) -> ConfigurationError | None:
    """The ConfigurationError for ``exc`` (a driver error) when it says that a watched
    queue table does not exist; None for every other error."""
    sqlstate = sqlstate_of(exc)
    if dialect.name == "postgresql" and sqlstate == _UNDEFINED_TABLE:
        match = _POSTGRES_NAME.search(str(exc))
    elif dialect.name == "postgresql" and sqlstate == _UNDEFINED_FUNCTION:
        match = _POSTGRES_FUNCTION.search(str(exc))
    elif dialect.name == "sqlite":
        match = _SQLITE_NAME.search(str(exc))
    else:
        return None
    if match is None:
        return None
    name = match.group(1).rpartition(".")[2]  # without the schema
    prefix = _WATCHED.get(dialect, {}).get(name)
    if prefix is None:
        return None
    if sqlstate == _UNDEFINED_FUNCTION:
        return ConfigurationError(
            f"the queue's function {name} (claims of limited types) does not exist: the "
            f"tables of prefix {prefix!r} were not made by migrate(); if your own Alembic "
            f"made them, run `queuert-notify migrate --adopt --database-url URL "
            f"--table-prefix {prefix}` once"
        )
    return ConfigurationError(
        f"the queue's table {name} does not exist: this database was never migrated for "
        f"table prefix {prefix!r}; run `await state.migrate()` or `queuert-notify migrate "
        f"--database-url URL --table-prefix {prefix}` first"
    )


def _on_error(context: ExceptionContext) -> None:
    missing = error(context.dialect, context.original_exception)
    if missing is not None:
        # Raised here, it replaces SQLAlchemy's error (SQL and parameters included).
        raise missing
