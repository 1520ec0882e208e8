"""The last tick each periodic schedule ran: one row per schedule name.

A tick is taken by compare-and-set on that row (:func:`take_tick`): it moves only
forward, so among any number of workers, processes and restarts racing for one tick
exactly one takes it, and nobody takes a tick older than one already taken (a worker
whose clock lags cannot run a past tick again). The taker starts the tick's chain in
the same transaction, so a tick is taken if and only if its chain was started.

The row outlives the chains it started: retention may delete them without making a
tick due again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Update, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from state_adapters.schema import Tables
from state_adapters.statements.dialect import SqlDialect


class ScheduleStatements:
    """The statements on the schedules table of one table set."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect

    def advance(self, name: str, tick: datetime, chain_id: str | None, now: datetime) -> Update:
        """Move the schedule's last tick forward to ``tick``; matches nothing when the
        last tick is ``tick`` or later (or the schedule has no row)."""
        schedules = self.tables.schedules
        return (
            update(schedules)
            .where(schedules.c.name == name, schedules.c.last_tick < tick)
            .values(last_tick=tick, chain_id=chain_id, updated_at=now)
            .returning(schedules.c.name)
        )

    def insert(self, name: str, tick: datetime, chain_id: str | None, now: datetime) -> Any:
        """The schedule's first row, unless it has one (returns the row if inserted)."""
        schedules = self.tables.schedules
        return (
            self.dialect.insert_or_ignore(schedules)
            .values(name=name, last_tick=tick, chain_id=chain_id, updated_at=now)
            .returning(schedules.c.name)
        )

    def read(self, names: Sequence[str]) -> Select[Any]:
        schedules = self.tables.schedules
        return select(schedules.c.name, schedules.c.last_tick).where(
            schedules.c.name.in_(list(names))
        )


async def take_tick(
    conn: AsyncConnection,
    statements: ScheduleStatements,
    name: str,
    tick: datetime,
    chain_id: str | None,
    now: datetime,
) -> bool:
    """Whether this transaction took ``tick`` of schedule ``name``: True for exactly one
    of any number of concurrent callers, and only if no tick at or after it was taken.

    ``chain_id=None`` registers a schedule seen for the first time: it records ``tick``
    only when the schedule has no row, and never moves an existing one.

    Postgres: the UPDATE waits for a concurrent taker's row lock, then re-reads the row
    and matches nothing; two first INSERTs meet on the primary key and one inserts
    nothing. SQLite: the transaction holds the database (``BEGIN IMMEDIATE``).
    """
    if chain_id is not None:
        moved = await conn.execute(statements.advance(name, tick, chain_id, now))
        if moved.first() is not None:
            return True
    inserted = await conn.execute(statements.insert(name, tick, chain_id, now))
    return inserted.first() is not None


async def last_ticks(
    conn: AsyncConnection, statements: ScheduleStatements, names: Sequence[str]
) -> Mapping[str, datetime]:
    """The last tick taken of each of these schedules that has one."""
    if not names:
        return {}
    return {row.name: row.last_tick for row in await conn.execute(statements.read(names))}
