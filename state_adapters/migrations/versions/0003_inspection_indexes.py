"""Indexes for the reads that show the queue (state_adapters/steps/inspection.py): chain
search by deduplication key, chains by status newest first, jobs finished recently.
All three are partial: a job that is started, claimed and completed enters only
jobs_finished_ix, once.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import SETTLED_ASIDE, Tables

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    has_dedup_key = sa.text("dedup_key IS NOT NULL")
    settled_aside = sa.text(SETTLED_ASIDE)
    finished = sa.text("completed_at IS NOT NULL")
    op.create_index(
        f"{p}chains_dedup_ix",
        f"{p}chains",
        ["dedup_key"],
        schema=schema,
        postgresql_where=has_dedup_key,
        sqlite_where=has_dedup_key,
    )
    op.create_index(
        f"{p}jobs_status_chain_ix",
        f"{p}jobs",
        ["status", "chain_id"],
        schema=schema,
        postgresql_where=settled_aside,
        sqlite_where=settled_aside,
    )
    op.create_index(
        f"{p}jobs_finished_ix",
        f"{p}jobs",
        ["completed_at", "type_name", "status"],
        schema=schema,
        postgresql_where=finished,
        sqlite_where=finished,
    )


def downgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    op.drop_index(f"{p}jobs_finished_ix", f"{p}jobs", schema=schema)
    op.drop_index(f"{p}jobs_status_chain_ix", f"{p}jobs", schema=schema)
    op.drop_index(f"{p}chains_dedup_ix", f"{p}chains", schema=schema)
