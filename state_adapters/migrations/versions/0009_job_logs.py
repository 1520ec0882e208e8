"""The lines jobs log (``ctx.log``, ``JobLogHandler``): the job_logs table.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, UtcDateTime, json_type

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    # Adopted tables are stamped with 0006 (migrations/runner.py, TABLES_REVISION)
    # and already match the newest schema, this table included.
    if sa.inspect(op.get_bind()).has_table(f"{p}job_logs", schema=schema):
        return
    op.create_table(
        f"{p}job_logs",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fields", json_type(), nullable=True),
        schema=schema,
    )
    op.create_index(f"{p}job_logs_ix", f"{p}job_logs", ["job_id", "attempt", "seq"], schema=schema)


def downgrade(tables: Tables) -> None:
    op.drop_table(f"{tables.table_prefix}job_logs", schema=tables.schema)
