"""Alembic's ``render_item`` hook for applications whose own migrations create the
queue's tables from :func:`state_adapters.make_metadata` (docs/databases.md, recipe 2).

Alembic renders a Postgres-only variant with its Postgres spelling only when it
autogenerates against Postgres; against SQLite, ``JSONB``'s default
``astext_type`` comes out as a bare ``Text()`` and the revision fails with
``NameError`` at upgrade. The hook spells the queue's JSON columns out in full,
so a revision runs whichever database it was generated against (``TEXT`` on SQLite:
see :class:`state_adapters.schema.JsonDocument`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import JSON, Text
from sqlalchemy.dialects.postgresql import JSONB

if TYPE_CHECKING:
    # A type only: importing Alembic costs every CLI command a second of start-up.
    from alembic.autogenerate.api import AutogenContext


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render the queue's JSON column type (``JSON``; ``JSONB`` on Postgres, ``TEXT`` on
    SQLite) as code that imports only SQLAlchemy; leave every other object (``False``) to
    Alembic."""
    variants = getattr(obj, "_variant_mapping", {})
    if (
        type_ != "type"
        or type(obj) is not JSON
        or type(variants.get("postgresql")) is not JSONB
        or type(variants.get("sqlite")) is not Text
    ):
        return False
    autogen_context.imports.add("from sqlalchemy.dialects import postgresql")
    return (
        "sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')"
        ".with_variant(sa.Text(), 'sqlite')"
    )
