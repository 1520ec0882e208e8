"""Periodic schedules' last ticks, and an index retention reads finished chains by.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    finished = sa.text("completed_at IS NOT NULL")
    op.create_index(
        f"{p}chains_completed_ix",
        f"{p}chains",
        ["completed_at"],
        schema=schema,
        postgresql_where=finished,
        sqlite_where=finished,
    )
    op.create_table(
        f"{p}schedules",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("last_tick", UtcDateTime(), nullable=False),
        sa.Column("chain_id", sa.String(32), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        schema=schema,
    )


def downgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    op.drop_table(f"{p}schedules", schema=schema)
    op.drop_index(f"{p}chains_completed_ix", f"{p}chains", schema=schema)
