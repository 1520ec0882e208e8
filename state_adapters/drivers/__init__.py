"""The DB-API drivers under SQLAlchemy's Postgres engines, behind one small interface
(:class:`Driver`) chosen once per engine by :func:`driver_for`: what the queue must know
of a driver that SQLAlchemy does not say. One module per driver."""

from __future__ import annotations

from typing import Any, Protocol


class Driver(Protocol):
    """One Postgres driver, as the queue sees it."""

    name: str
    """SQLAlchemy's name of the driver (``dialect.driver``)."""

    pooler_connect_args: dict[str, Any]
    """``connect_args`` of an engine whose connections keep no statement prepared on the
    server past the transaction that ran it (which a pooler in transaction mode hands
    to another server connection)."""

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        """Whether this connection may reuse, in a later transaction, a statement it
        prepared on the server (it was made without :attr:`pooler_connect_args`)."""
        ...

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        """The backend process id the server announced when the connection opened; a
        pooler announces one of its own, unlike ``pg_backend_pid()``."""
        ...


POSTGRES_DRIVERS = ("psycopg", "asyncpg", "psycopg2")
"""SQLAlchemy's names of the Postgres drivers the queue accepts."""


def driver_for(name: str) -> Driver:
    """The Postgres driver SQLAlchemy calls ``name`` (one of :data:`POSTGRES_DRIVERS`)."""
    if name == "asyncpg":
        from state_adapters.drivers.asyncpg import Asyncpg

        return Asyncpg()
    if name == "psycopg2":
        from state_adapters.drivers.psycopg2 import Psycopg2

        return Psycopg2()
    from state_adapters.drivers.psycopg import Psycopg

    return Psycopg()
