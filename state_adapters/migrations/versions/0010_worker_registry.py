"""The worker registry: ``{prefix}workers``, one row per running worker (id, host, pid,
the job types it handles, its slots, when it started and last beat).

Created only when missing: tables adopted from the application's own Alembic
(``make_metadata``) already have it, and adoption stamps the last revision that changed
tables before this one.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, json_type

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    if sa.inspect(op.get_bind()).has_table(f"{p}workers", schema=schema):
        return
    op.create_table(
        f"{p}workers",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("type_names", json_type(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )


def downgrade(tables: Tables) -> None:
    op.drop_table(f"{tables.table_prefix}workers", schema=tables.schema)
