"""The state adapter's SQL on a synchronous connection, for ``SyncClient``.

``SqlAlchemyStateAdapter`` writes chains with coroutines that await only the
connection they are given. Given a :class:`SyncConnection` (an ``AsyncConnection``
look-alike over a sync ``Connection``), those awaits finish at once, so
:func:`run_to_completion` runs the coroutine to its end on the calling thread: one
implementation of starting, reading, cancelling and retrying chains serves both
clients, with the same statements, validation and deduplication.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Result

T = TypeVar("T")


class SyncConnection:
    """What the state adapter awaits of an ``AsyncConnection``, done synchronously on
    ``connection`` (in its transaction, which stays the caller's)."""

    __slots__ = ("sync_connection",)

    def __init__(self, connection: Connection) -> None:
        self.sync_connection = connection

    @property
    def dialect(self) -> Dialect:
        return self.sync_connection.dialect

    async def execute(self, statement: Any, parameters: Any = None) -> Result[Any]:
        return self.sync_connection.execute(statement, parameters)

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self.sync_connection.scalar(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Result[Any]:
        return self.sync_connection.exec_driver_sql(statement, parameters)


def run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this thread; it must not wait on an event loop (it may await
    only a :class:`SyncConnection`)."""
    try:
        coro.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a state-layer call waited on an event loop; it cannot run synchronously")
