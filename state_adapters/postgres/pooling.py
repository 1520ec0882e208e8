"""Postgres behind a connection pooler in transaction mode (PgBouncer): refuse, in one
line, an engine whose driver would keep statements prepared past their transaction.

Such a pooler gives each transaction whichever server connection is free, so a
statement prepared in one transaction is missing (or already there under its name) in
the next: ``prepared statement "_pg3_0" does not exist``, from any statement, at any
time. Every other piece of session state the queue could rely on is avoided by design
(transaction-scoped advisory locks, ``set_config(..., true)``, no temp tables, LISTEN
only on the notify adapter's own direct connection).

A pooler is recognized on each new connection of the engine: the backend process id it
announced at startup is its own, not the ``pg_backend_pid()`` of the server connection
that runs the query.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from state_adapters.drivers import Driver, driver_for
from state_adapters.errors import ConfigurationError, mask_url

_WATCHED: weakref.WeakSet[Engine] = weakref.WeakSet()


def watch(engine: AsyncEngine | Engine) -> None:
    """From now on, a new connection of ``engine`` (Postgres) through a pooler, on a
    driver that would keep prepared statements, raises :class:`ConfigurationError`
    naming the engine setting to change (idempotent)."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    if sync_engine in _WATCHED:
        return
    _WATCHED.add(sync_engine)
    driver = driver_for(sync_engine.dialect.driver)
    url = mask_url(sync_engine.url.render_as_string(hide_password=False))

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        check(driver, dbapi_connection, url)

    event.listen(sync_engine, "connect", on_connect)


def check(driver: Driver, dbapi_connection: Any, url: str) -> None:
    """Raise :class:`ConfigurationError` when ``dbapi_connection`` (fresh, of
    ``driver``) goes through a pooler and would keep prepared statements."""
    if not driver.keeps_prepared_statements(dbapi_connection):
        return  # nothing to ask the server
    cursor = dbapi_connection.cursor()
    # No cleanup in a finally: when the query fails or its task is cancelled, the pool
    # closes this new connection itself, and a rollback on one the driver has already
    # closed (psycopg does, when a cancelled query cannot be cancelled on the server)
    # would raise its own error in place of the cancellation.
    cursor.execute("SELECT pg_backend_pid()")
    (server_pid,) = cursor.fetchone()
    cursor.close()
    dbapi_connection.rollback()  # the query began a transaction; hand over none
    if server_pid == driver.reported_backend_pid(dbapi_connection):
        return
    raise ConfigurationError(
        f"the engine on {url} reaches Postgres through a connection pooler (PgBouncer?) "
        f"and {driver.name} keeps prepared statements, which a pooler in transaction mode "
        f"loses between transactions: create the engine with "
        f"connect_args={driver.pooler_connect_args!r}"
    )
