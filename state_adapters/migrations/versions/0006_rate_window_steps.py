"""The rate window's newest step in columns of its own: ``step_at`` and
``step_starts``, and ``earlier_starts``, the sum of the earlier steps still in the
window (state_adapters.steps.limited_claims.RateWindow), so a claim within the step reads
and writes no JSON. A window 0005 wrote has no newest step yet: the next claim takes
all its entries as earlier steps. On the way down the newest step is appended to
them again, as 0005 keeps it.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from state_adapters.schema import Tables, json_type

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    # Nullable or with a server default: adding them rewrites no row.
    for column in (
        sa.Column("step_at", sa.Float(), nullable=True),
        sa.Column("step_starts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("earlier_starts", sa.Integer(), nullable=False, server_default="0"),
    ):
        op.add_column(f"{p}type_controls", column, schema=schema)


def downgrade(tables: Tables) -> None:
    p, schema = tables.table_prefix, tables.schema
    _join_windows(tables)
    with op.batch_alter_table(f"{p}type_controls", schema=schema) as batch:
        for name in ("step_at", "step_starts", "earlier_starts"):
            batch.drop_column(name)


def _controls(tables: Tables) -> sa.TableClause:
    return sa.table(
        f"{tables.table_prefix}type_controls",
        sa.column("type_name", sa.String()),
        sa.column("recent_starts", json_type()),
        sa.column("step_at", sa.Float()),
        sa.column("step_starts", sa.Integer()),
        schema=tables.schema,
    )


def _join_windows(tables: Tables) -> None:
    """The newest step back as the last entry of ``recent_starts``, as 0005 keeps it."""
    controls = _controls(tables)
    bind = op.get_bind()
    windows = bind.execute(
        sa.select(
            controls.c.type_name,
            controls.c.recent_starts,
            controls.c.step_at,
            controls.c.step_starts,
        ).where(controls.c.step_at.is_not(None), controls.c.step_starts > 0)
    ).all()
    for type_name, starts, step_at, step_starts in windows:
        earlier = starts if isinstance(starts, list) else []
        bind.execute(
            sa.update(controls)
            .where(controls.c.type_name == type_name)
            .values(recent_starts=[*earlier, [step_at, step_starts]])
        )
