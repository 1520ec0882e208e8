"""Faults on demand for the fault tests: seeded bursts of connection errors on every
method of a real notify adapter, and on the statements of a real SQLAlchemy engine.

The schedule is seeded per method (or per engine), so a run fails the same calls of a
method in the same order; which operation a call belongs to still depends on timing.
"""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify.notify.protocol import (
    NotifyAdapter,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)


class SeededBursts:
    """Decides, call by call, whether a call fails: each call outside a burst starts a
    burst of 1..``max_burst`` failing calls with probability ``rate``."""

    def __init__(self, seed: str, *, rate: float, max_burst: int) -> None:
        self._random = random.Random(seed)
        self._rate = rate
        self._max_burst = max_burst
        self._left = 0

    def next_call_fails(self) -> bool:
        if self._left == 0 and self._random.random() < self._rate:
            self._left = self._random.randint(1, self._max_burst)
        if self._left == 0:
            return False
        self._left -= 1
        return True


class FaultSchedule:
    """One :class:`SeededBursts` per operation name, armed and disarmed as a whole, with
    a count of the failures injected per operation."""

    def __init__(self, seed: int, *, rate: float = 0.15, max_burst: int = 4) -> None:
        self._seed = seed
        self._rate = rate
        self._max_burst = max_burst
        self._bursts: dict[str, SeededBursts] = {}
        self.armed = False
        self.injected: Counter[str] = Counter()

    def fails(self, operation: str) -> bool:
        if not self.armed:
            return False
        bursts = self._bursts.get(operation)
        if bursts is None:
            bursts = SeededBursts(
                f"{self._seed}:{operation}", rate=self._rate, max_burst=self._max_burst
            )
            self._bursts[operation] = bursts
        if not bursts.next_call_fails():
            return False
        self.injected[operation] += 1
        return True


class FlakyNotifyAdapter:
    """A real notify adapter whose every method (and every unsubscribe function it hands
    out) raises ``ConnectionError`` when the schedule says so, before reaching the
    transport, as a dropped connection would."""

    def __init__(self, inner: NotifyAdapter, schedule: FaultSchedule) -> None:
        self.inner = inner
        self.schedule = schedule

    def _check(self, operation: str) -> None:
        if self.schedule.fails(operation):
            raise ConnectionError(f"injected fault: connection reset during {operation}")

    def _flaky_unsubscribe(self, unsubscribe: Unsubscribe) -> Unsubscribe:
        async def flaky() -> None:
            self._check("unsubscribe")
            await unsubscribe()

        return flaky

    async def connect(self) -> None:
        self._check("connect")
        await self.inner.connect()

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> FlakyNotifyAdapter:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def notify_job_scheduled(self, type_name: str) -> None:
        self._check("notify_job_scheduled")
        await self.inner.notify_job_scheduled(type_name)

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        self._check("listen_job_scheduled")
        return self._flaky_unsubscribe(await self.inner.listen_job_scheduled(type_names, callback))

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        self._check("provide_wake_hint")
        await self.inner.provide_wake_hint(type_name, count)

    async def consume_wake_hint(self, type_name: str) -> bool:
        self._check("consume_wake_hint")
        return await self.inner.consume_wake_hint(type_name)

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        self._check("notify_jobs_scheduled")
        await self.inner.notify_jobs_scheduled(counts)

    async def notify_chain_completed(self, chain_id: str) -> None:
        self._check("notify_chain_completed")
        await self.inner.notify_chain_completed(chain_id)

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check("listen_chain_completed")
        return self._flaky_unsubscribe(await self.inner.listen_chain_completed(chain_id, callback))

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        self._check("notify_job_ownership_lost")
        await self.inner.notify_job_ownership_lost(job_id)

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        self._check("listen_job_ownership_lost")
        return self._flaky_unsubscribe(await self.inner.listen_job_ownership_lost(job_id, callback))

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        self._check("on_reconnect")
        return self._flaky_unsubscribe(self.inner.on_reconnect(callback))


_DISCONNECT_MESSAGES = {
    "postgresql": "server closed the connection unexpectedly",
    "sqlite": "no active connection",
}


def faulty_engine(
    database_url: str, schedule: FaultSchedule, **options: Any
) -> tuple[AsyncEngine, Callable[[], None]]:
    """An engine on ``database_url`` that drops the connection under a statement when
    ``schedule`` says so: the driver connection is closed and the driver's own
    ``OperationalError`` raised, so SQLAlchemy sees a disconnect and invalidates the
    connection as it does when the server goes away. The statement never reaches the
    server, so a failed statement changed nothing (and the transaction it was part of
    is gone). Returns the engine and a function that stops the faults.

    On SQLite the adapter's own transactions run on the sqlite3 connection itself, in
    the aiosqlite thread (``state_adapters/sqlite/driver.py``), past the engine's
    events: the engine's connections are made by a ``sqlite3.Connection`` subclass
    whose ``execute`` and ``executemany`` fail there, statement by statement."""
    active = True

    def fails() -> bool:
        return active and schedule.fails("statement")

    if database_url.startswith("sqlite"):
        options.setdefault("connect_args", {})["factory"] = _faulty_sqlite(fails)
    engine = create_async_engine(database_url, **options)
    dbapi = engine.dialect.loaded_dbapi
    message = _DISCONNECT_MESSAGES[engine.dialect.name]
    sync_engine = engine.sync_engine

    def before_cursor_execute(connection: Connection, *args: Any) -> None:
        if fails():
            connection.connection.dbapi_connection.close()  # type: ignore[union-attr]
            raise dbapi.OperationalError(message)

    def remove() -> None:
        nonlocal active
        active = False
        event.remove(sync_engine, "before_cursor_execute", before_cursor_execute)

    event.listen(sync_engine, "before_cursor_execute", before_cursor_execute)
    return engine, remove


def _faulty_sqlite(fails: Callable[[], bool]) -> type[sqlite3.Connection]:
    message = _DISCONNECT_MESSAGES["sqlite"]

    class FaultySqlite(sqlite3.Connection):
        """Closes itself and fails, in the thread that runs the statement."""

        def execute(self, *args: Any) -> sqlite3.Cursor:
            self._maybe_fail()
            return super().execute(*args)

        def executemany(self, *args: Any) -> sqlite3.Cursor:
            self._maybe_fail()
            return super().executemany(*args)

        def _maybe_fail(self) -> None:
            if fails():
                self.close()
                raise sqlite3.OperationalError(message)

    return FaultySqlite
