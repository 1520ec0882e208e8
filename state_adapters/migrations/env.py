"""Alembic environment: runs on the connection and table set given by the runner."""

from __future__ import annotations

from alembic import context

config = context.config
connection = config.attributes["connection"]
tables = config.attributes["tables"]

context.configure(
    connection=connection,
    target_metadata=tables.metadata,
    version_table=tables.version_table,
    version_table_schema=tables.schema,
)
# The runner's connection is already in a transaction: Alembic joins it.
with context.begin_transaction():
    context.run_migrations(tables=tables)
