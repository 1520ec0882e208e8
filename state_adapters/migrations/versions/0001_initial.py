"""Initial schema: chains, jobs, blockers, dedup keys.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, UtcDateTime, json_type

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    pending = sa.text("status = 'pending'")
    running = sa.text("status = 'running'")
    op.create_table(
        f"{p}chains",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("type_name", sa.String(200), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("completed_at", UtcDateTime(), nullable=True),
        sa.Column("has_dependents", sa.Boolean(), nullable=False),
        sa.Column("dedup_key", sa.String(255), nullable=True),
        schema=schema,
    )
    op.create_index(f"{p}chains_type_ix", f"{p}chains", ["type_name", "id"], schema=schema)
    op.create_table(
        f"{p}jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("chain_id", sa.String(32), nullable=False),
        sa.Column("chain_index", sa.Integer(), nullable=False),
        sa.Column("type_name", sa.String(200), nullable=False),
        sa.Column("input", json_type(), nullable=True),
        sa.Column("output", json_type(), nullable=True),
        sa.Column("progress", json_type(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("scheduled_at", UtcDateTime(), nullable=False),
        sa.Column("completed_at", UtcDateTime(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("leased_by", sa.String(255), nullable=True),
        sa.Column("lease_token", sa.String(32), nullable=True),
        sa.Column("leased_until", UtcDateTime(), nullable=True),
        sa.Column("deduplication_key", sa.String(255), nullable=True),
        sa.Column("blockers_pending", sa.Integer(), nullable=False),
        sa.UniqueConstraint("chain_id", "chain_index", name=f"{p}jobs_chain_uq"),
        schema=schema,
    )
    op.create_index(
        f"{p}jobs_acquire_ix",
        f"{p}jobs",
        ["type_name", "priority", "scheduled_at", "id"],
        schema=schema,
        postgresql_where=pending,
        sqlite_where=pending,
    )
    op.create_index(
        f"{p}jobs_due_ix",
        f"{p}jobs",
        ["type_name", "scheduled_at"],
        schema=schema,
        postgresql_where=pending,
        sqlite_where=pending,
    )
    op.create_index(
        f"{p}jobs_lease_ix",
        f"{p}jobs",
        ["leased_until"],
        schema=schema,
        postgresql_where=running,
        sqlite_where=running,
    )
    op.create_index(f"{p}jobs_status_ix", f"{p}jobs", ["status", "type_name"], schema=schema)
    op.create_table(
        f"{p}blockers",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("blocker_chain_id", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "blocker_chain_id", name=f"{p}blockers_pk"),
        schema=schema,
    )
    op.create_index(f"{p}blockers_blocker_ix", f"{p}blockers", ["blocker_chain_id"], schema=schema)
    op.create_table(
        f"{p}dedup_keys",
        sa.Column("type_name", sa.String(200), nullable=False),
        sa.Column("dedup_key", sa.String(255), nullable=False),
        sa.Column("chain_id", sa.String(32), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("type_name", "dedup_key", name=f"{p}dedup_keys_pk"),
        schema=schema,
    )
    op.create_index(f"{p}dedup_keys_chain_ix", f"{p}dedup_keys", ["chain_id"], schema=schema)


def downgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    for name in ("dedup_keys", "blockers", "jobs", "chains"):
        op.drop_table(f"{p}{name}", schema=schema)
