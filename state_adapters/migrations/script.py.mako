"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from __future__ import annotations

from alembic import op

from state_adapters.schema import Tables

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade(tables: Tables) -> None:
    ${upgrades if upgrades else "pass"}


def downgrade(tables: Tables) -> None:
    ${downgrades if downgrades else "pass"}
