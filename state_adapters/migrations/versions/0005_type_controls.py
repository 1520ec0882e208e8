"""Pause and limits per job type: the type_controls table, jobs.concurrency_key and
the index that walks a type's keys with pending jobs.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, json_type

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    keyed_pending = sa.text("status = 'pending' AND concurrency_key IS NOT NULL")
    # Nullable, no default: adding it rewrites no row (Postgres and SQLite).
    op.add_column(
        f"{p}jobs", sa.Column("concurrency_key", sa.String(255), nullable=True), schema=schema
    )
    op.create_index(
        f"{p}jobs_key_ix",
        f"{p}jobs",
        ["type_name", "concurrency_key", "priority", "scheduled_at", "id"],
        schema=schema,
        postgresql_where=keyed_pending,
        sqlite_where=keyed_pending,
    )
    op.create_table(
        f"{p}type_controls",
        sa.Column("type_name", sa.String(200), primary_key=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("key_concurrency", sa.Integer(), nullable=True),
        sa.Column("rate", sa.Integer(), nullable=True),
        sa.Column("per_seconds", sa.Float(), nullable=True),
        sa.Column("recent_starts", json_type(), nullable=True),
        sa.Column("next_key_after", sa.String(255), nullable=True),
        schema=schema,
    )


def downgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    op.drop_table(f"{p}type_controls", schema=schema)
    op.drop_index(f"{p}jobs_key_ix", table_name=f"{p}jobs", schema=schema)
    with op.batch_alter_table(f"{p}jobs", schema=schema) as batch:
        batch.drop_column("concurrency_key")
