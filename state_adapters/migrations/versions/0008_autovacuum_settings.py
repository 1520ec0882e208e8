"""Postgres: autovacuum and analyze settings fit for the queue's high-churn tables
(SQLite gets nothing: it keeps no dead row versions).

Every job is inserted, claimed (an update), completed (another) and in time deleted by
retention; every chain is inserted, made final and deleted. Autovacuum's defaults wait
for 20 % of a table to be dead (and 10 % changed before an ANALYZE): on a jobs table of
a million finished rows that is 200,000 dead versions that claims step over before
vacuum starts. These settings start it at 2 % (and ANALYZE at 2 %), run the insert-only
vacuum that keeps the visibility map fresh at 2 % too, and let each run go at twice
the default cost budget, for the tables of this table set only:

    autovacuum_vacuum_scale_factor = 0.02    (default 0.2)
    autovacuum_vacuum_insert_scale_factor = 0.02    (default 0.2; Postgres 13+)
    autovacuum_analyze_scale_factor = 0.02    (default 0.1)
    autovacuum_vacuum_cost_limit = 400    (default 200, from vacuum_cost_limit)

They are storage parameters, so an operator overrides them with ``ALTER TABLE ... SET
(...)`` or ``RESET (...)`` at any time; this revision runs once and later ones do not
touch them (docs/operations.md, Health). The downgrade resets them.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

from state_adapters.schema import Tables

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CHURNING = ("jobs", "chains", "blockers", "dedup_keys")
"""The tables every job or chain inserts into, updates and deletes from."""
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_limit": "400",
}
INSERT_SETTINGS = {"autovacuum_vacuum_insert_scale_factor": "0.02"}
"""Known from Postgres 13 on."""


def upgrade(tables: Tables) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    settings = dict(SETTINGS)
    if (bind.dialect.server_version_info or (0,)) >= (13,):
        settings.update(INSERT_SETTINGS)
    assignments = ", ".join(f"{name} = {value}" for name, value in settings.items())
    for table in CHURNING:
        op.execute(f"ALTER TABLE {_name(tables, table)} SET ({assignments})")


def downgrade(tables: Tables) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    names = list(SETTINGS)
    if (bind.dialect.server_version_info or (0,)) >= (13,):
        names += list(INSERT_SETTINGS)
    for table in CHURNING:
        op.execute(f"ALTER TABLE {_name(tables, table)} RESET ({', '.join(names)})")


def _name(tables: Tables, table: str) -> str:
    quote = op.get_bind().dialect.identifier_preparer
    schema = "" if tables.schema is None else quote.quote_schema(tables.schema) + "."
    return schema + quote.quote(f"{tables.table_prefix}{table}")
