"""Retrying a state-adapter call whose database connection was lost or could not be made.

A pooled connection can die under a call: the server restarted, a proxy dropped it,
an operator ran ``pg_terminate_backend``. SQLAlchemy then raises a ``DBAPIError`` with
``connection_invalidated`` set and replaces the connection (and the rest of its pool)
on the next checkout. While the server is still down, restarting or failing over, the
replacement cannot be made: connecting is refused, or the server answers that it is
starting up or shutting down. Both are transient, and calling again with backoff
succeeds once the server is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from state_adapters.backoff import Backoff
from state_adapters.errors import cannot_connect_reason, unreachable

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_WINDOW = 15.0
"""Seconds a call keeps being repeated while the database is unreachable (backoff
50 ms .. 1 s), enough for a restart or a managed failover; then the error is raised."""
_FIRST_DELAY, _MAX_DELAY = 0.05, 1.0

_TRANSIENT_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown: the server is shutting down or terminated the backend
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: the server is starting up or in recovery
    }
)


def sqlstate_of(error: object) -> str | None:
    """The SQLSTATE of a driver's error: ``sqlstate`` on psycopg 3 and SQLAlchemy's
    asyncpg adapter, ``pgcode`` on psycopg2; None when it has none."""
    code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return code if isinstance(code, str) else None


def is_connection_loss(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached: the connection died
    under the call, connecting failed (refused, reset, timed out: no SQLSTATE), a
    connection exception (SQLSTATE class 08), or a server starting up or shutting
    down. Never for constraint violations, bad SQL, lock or statement timeouts, nor
    for a server that refuses the connection for good (:func:`is_refused`)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True  # asyncpg's connect raises the socket's error itself
    if not isinstance(exc, DBAPIError) or is_refused(exc):
        return False
    if exc.connection_invalidated:
        return True
    sqlstate = sqlstate_of(exc.orig)
    if sqlstate is None:
        # psycopg raises an OperationalError without a SQLSTATE when it cannot talk to
        # the server at all ("connection failed: ... Connection refused", "server
        # closed the connection unexpectedly"). SQLite's OperationalErrors (a locked
        # database) have no SQLSTATE either and are not connection losses.
        orig = type(exc.orig)
        return orig.__name__ == "OperationalError" and orig.__module__.startswith("psycopg")
    return sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES


_REFUSALS = (
    "does not exist",  # the database or the role
    "authentication failed",
    "no pg_hba.conf entry",
    "not permitted to log in",
)
"""What a Postgres server says when it refuses a connection for good. psycopg reports
these without a SQLSTATE (asyncpg with class 28 or 3D), like a refused port."""


def is_refused(exc: BaseException) -> bool:
    """True when the server answered but refused the connection for a reason waiting
    does not fix: wrong credentials, no such database or role, not allowed in."""
    if not isinstance(exc, DBAPIError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is not None:
        return str(sqlstate).startswith(("28", "3D"))
    message = str(exc.orig)
    return "FATAL:" in message and any(refusal in message for refusal in _REFUSALS)


async def retry_on_connection_loss(
    call: Callable[[], Awaitable[T]], *, what: str, until: float | None = None
) -> T:
    """Await ``call()``, calling again with jittered exponential backoff while the
    database is unreachable (:func:`is_connection_loss`), for :data:`RETRY_WINDOW`
    seconds or, with ``until`` (a ``loop.time()``), for as long as the next call would
    start before ``until``. Logs one WARNING when it first retries (the rest at DEBUG).

    Only for calls that are safe to repeat: reads, writes fenced by a lease token, and
    writes in a transaction of their own. A connection lost while COMMIT was in flight
    leaves that commit's outcome unknown; a fenced write repeated after it is refused
    (``JobOwnershipLostError``) and changes nothing.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETRY_WINDOW if until is None else until
    # Built at the first failure: a worker awaits every completion through here.
    backoff: Backoff | None = None
    attempt = 1
    while True:
        try:
            return await call()
        except DBAPIError as exc:
            if backoff is None:
                backoff = Backoff(_FIRST_DELAY, _MAX_DELAY)
            pause = backoff.next()
            if not is_connection_loss(exc) or loop.time() + pause >= deadline:
                raise
            # One line per call at the default level; each further attempt at DEBUG.
            logger.log(
                logging.WARNING if attempt == 1 else logging.DEBUG,
                "database unreachable during %s; retrying for up to %.0fs: %s",
                what,
                deadline - loop.time(),
                cannot_connect_reason(exc, None),
                extra={"attempt": attempt, "error": type(exc.orig).__name__},
            )
        await asyncio.sleep(pause)
        attempt += 1


@asynccontextmanager
async def begin_or_explain(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """``engine.begin()``, where a database that cannot be connected to is the one-line
    :func:`~state_adapters.errors.unreachable` ``ConfigurationError`` (``migrate()``)."""
    try:
        connection = await engine.connect()
    except DBAPIError as exc:
        raise unreachable(engine.url, exc) from None
    try:
        async with connection.begin():
            yield connection
    finally:
        await connection.close()
