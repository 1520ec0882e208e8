"""SQLite: the JSON columns declared ``TEXT`` (Postgres: nothing to do).

Declared ``JSON``, they had NUMERIC affinity: SQLite stored a document that is a bare
number (a job's input, output or progress) as a REAL or an INTEGER and gave back
another double now and then, ``1`` for ``1.0``, ``0`` for ``-0.0``
(``state_adapters.schema.JsonDocument``). SQLite cannot change a column's declared type,
so each table with such a column is rebuilt (Alembic's batch mode: a copy of the table,
its indexes and constraints, then the rename), which takes the database's write lock
for as long as copying its rows takes.

Stored values keep what they read as: the copy turns a REAL into text of 15 digits, so
each REAL is written again as Python's shortest text of the same double, and reads
back as before. Tables whose JSON columns are already ``TEXT`` are left alone: those
made by 0001, 0005, 0009 and 0010 of this release on (their JSON type is
``JsonDocument``, now declared ``TEXT``), or by an application's Alembic from this
release's ``make_metadata``. On the way down the columns are declared ``JSON`` again, and SQLite
turns bare numbers back into REALs and INTEGERs.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Each table's JSON columns, and the columns that find one of its rows.
_JSON_COLUMNS = {
    "jobs": (("input", "output", "progress"), ("id",)),
    "type_controls": (("recent_starts",), ("type_name",)),
    "workers": (("type_names",), ("id",)),
    "job_logs": (("fields",), ("job_id", "attempt", "seq")),
}


def upgrade(tables: Tables) -> None:
    _declare(tables, sa.Text())


def downgrade(tables: Tables) -> None:
    _declare(tables, sa.JSON())


def _declare(tables: Tables, declared: sa.types.TypeEngine[Any]) -> None:
    """Rebuild each table whose JSON columns are not declared as ``declared`` (SQLite)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    inspector = sa.inspect(bind)
    wanted = declared.compile(dialect=bind.dialect)
    for name, (json_columns, key) in _JSON_COLUMNS.items():
        table = f"{tables.table_prefix}{name}"
        columns = {c["name"]: c for c in inspector.get_columns(table, schema=tables.schema)}
        changed = [
            c for c in json_columns if columns[c]["type"].compile(dialect=bind.dialect) != wanted
        ]
        if not changed:
            continue
        reals = _reals(bind, _table(tables, table, (*key, *changed)), changed, key)
        with op.batch_alter_table(table, schema=tables.schema, recreate="always") as batch:
            for column in changed:
                batch.alter_column(
                    column,
                    type_=declared,
                    existing_type=columns[column]["type"],
                    existing_nullable=columns[column]["nullable"],
                )
        _write_back(bind, _table(tables, table, (*key, *changed)), reals)


def _table(tables: Tables, name: str, columns: tuple[str, ...]) -> sa.TableClause:
    # Untyped columns: values as the driver reads and binds them.
    return sa.table(name, *(sa.column(c) for c in columns), schema=tables.schema)


def _reals(
    bind: sa.Connection, table: sa.TableClause, columns: list[str], key: tuple[str, ...]
) -> list[tuple[dict[str, Any], str, float]]:
    """Each REAL among ``columns``: the row's key, the column and the double."""
    found = []
    for column in columns:
        rows = bind.execute(
            sa.select(*(table.c[k] for k in key), table.c[column]).where(
                sa.func.typeof(table.c[column]) == "real"
            )
        )
        found += [(dict(zip(key, row[:-1], strict=True)), column, row[-1]) for row in rows]
    return found


def _write_back(
    bind: sa.Connection, table: sa.TableClause, reals: list[tuple[dict[str, Any], str, float]]
) -> None:
    """Each REAL as the JSON text of the same double (``json.dumps``: the shortest text
    that reads back as it), where the copy wrote 15 digits."""
    for key, column, value in reals:
        bind.execute(
            sa.update(table)
            .where(*(table.c[k] == v for k, v in key.items()))
            .values({column: json.dumps(value)})
        )
