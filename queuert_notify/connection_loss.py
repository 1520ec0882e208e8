"""Retrying a state-adapter call whose database connection was lost.

A pooled connection can die under a call: the server restarted, a proxy dropped it,
an operator ran ``pg_terminate_backend``. SQLAlchemy then raises a ``DBAPIError`` with
``connection_invalidated`` set and replaces the connection (and the rest of its pool)
on the next checkout, so calling again usually succeeds at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_ATTEMPTS = 6
"""Calls per operation before the connection loss is raised (backoff 50 ms .. 1 s)."""
_FIRST_DELAY, _MAX_DELAY = 0.05, 1.0


def is_connection_loss(exc: BaseException) -> bool:
    """True when ``exc`` says the database connection died under the call (nothing else:
    constraint violations, bad SQL and lock timeouts are not retried here)."""
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


async def retry_on_connection_loss(
    call: Callable[[], Awaitable[T]], *, what: str, until: float | None = None
) -> T:
    """Await ``call()``, calling again with jittered exponential backoff while it fails
    with a lost connection, up to :data:`RETRY_ATTEMPTS` calls or, with ``until`` (a
    ``loop.time()``), for as long as the next call would start before ``until``.

    Only for calls that are safe to repeat: reads, writes fenced by a lease token, and
    writes in a transaction of their own. A connection lost while COMMIT was in flight
    leaves that commit's outcome unknown; a fenced write repeated after it is refused
    (``JobOwnershipLostError``) and changes nothing.
    """
    loop = asyncio.get_running_loop()
    delay, attempt = _FIRST_DELAY, 1
    while True:
        try:
            return await call()
        except DBAPIError as exc:
            pause = delay * random.uniform(0.5, 1.0)
            exhausted = attempt >= RETRY_ATTEMPTS if until is None else loop.time() + pause >= until
            if not is_connection_loss(exc) or exhausted:
                raise
            logger.warning(
                "database connection lost during %s; retrying in %.2fs",
                what,
                pause,
                extra={"attempt": attempt, "error": type(exc.orig).__name__},
            )
        await asyncio.sleep(pause)
        delay, attempt = min(delay * 2, _MAX_DELAY), attempt + 1
