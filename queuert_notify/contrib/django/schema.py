"""The queue's tables under Django's ``migrate``: the app's migration runs the queue's
own (Alembic) migrations for every table prefix the ``TASKS`` backends of this package
write to the database being migrated."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from sqlalchemy import create_engine

from queuert_notify.client.sync_client import SyncClient
from queuert_notify.contrib.django.databases import engine_url
from queuert_notify.contrib.django.options import BackendOptions

BACKEND = "queuert_notify.contrib.django.QueuertTaskBackend"


def table_prefixes(database_alias: str) -> list[str]:
    """The table prefixes the configured backends keep in ``database_alias``."""
    prefixes: list[str] = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if params.get("BACKEND") != BACKEND:
            continue
        options = BackendOptions.parse(alias, params.get("OPTIONS", {}))
        if options.database == database_alias and options.table_prefix not in prefixes:
            prefixes.append(options.table_prefix)
    return prefixes


def migrate_queue_tables(apps: Any, schema_editor: Any) -> None:
    """Create or upgrade the queue's tables on the migrated database (the queue's
    migrations take their own lock, so concurrent ``migrate`` runs take turns). They
    run on a connection of their own, committed before Django records the migration."""
    connection = schema_editor.connection
    prefixes = table_prefixes(connection.alias)
    if not prefixes:
        return
    engine = create_engine(engine_url(connection.settings_dict, asynchronous=False))
    try:
        for prefix in prefixes:
            SyncClient(engine, table_prefix=prefix).migrate()
    finally:
        engine.dispose()
