"""SQLAlchemy engines on the database of a Django ``DATABASES`` entry, for what runs
beside Django's own connections: the queue's migrations and the asyncio worker.

Postgres (Django's psycopg 3 or psycopg2 backend) maps to ``postgresql+psycopg``: the
worker and the migrations need psycopg 3 installed (extra ``[postgres]``) even when the
web processes use psycopg2. SQLite maps to the same file, ``sqlite+aiosqlite`` for the
worker (extra ``[sqlite]``) and ``sqlite`` for the migrations; an in-memory SQLite
database cannot be shared with another connection and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL

from queuert_notify.errors import ConfigurationError

_LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "options",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "passfile",
    "service",
)
"""``DATABASES[...]["OPTIONS"]`` keys that are libpq connection parameters."""


def engine_url(settings: Mapping[str, Any], *, asynchronous: bool) -> URL:
    """The SQLAlchemy URL of a ``DATABASES`` entry (``asynchronous``: for the worker)."""
    engine = str(settings.get("ENGINE", ""))
    if engine.endswith(".postgresql"):
        options = settings.get("OPTIONS") or {}
        query = {key: str(options[key]) for key in _LIBPQ_OPTIONS if key in options}
        port = settings.get("PORT")
        return URL.create(
            "postgresql+psycopg",
            username=settings.get("USER") or None,
            password=settings.get("PASSWORD") or None,
            host=settings.get("HOST") or None,
            port=int(port) if port else None,
            database=settings.get("NAME") or None,
            query=query,
        )
    if engine.endswith(".sqlite3"):
        name = str(settings.get("NAME", ""))
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ConfigurationError(
                "the queue's worker and migrations need a SQLite database file; an "
                "in-memory database cannot be shared with another connection"
            )
        return URL.create("sqlite+aiosqlite" if asynchronous else "sqlite", database=name)
    raise ConfigurationError(
        f"the queuert task backend supports Postgres and SQLite databases, not {engine!r}"
    )
