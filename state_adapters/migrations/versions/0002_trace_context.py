"""Jobs carry the trace context of the request that started them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    # Nullable with no default: adding it rewrites no rows on Postgres or SQLite.
    op.add_column(
        f"{tables.table_prefix}jobs",
        sa.Column("trace_context", sa.Text(), nullable=True),
        schema=tables.schema,
    )


def downgrade(tables: Tables) -> None:
    with op.batch_alter_table(f"{tables.table_prefix}jobs", schema=tables.schema) as batch:
        batch.drop_column("trace_context")
