"""Operating the queue: the state adapter's retention and schedule-tick methods, thin
callers of :mod:`state_adapters.steps.pruning` and :mod:`state_adapters.steps.schedule_ticks`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, select

from state_adapters import validation
from state_adapters.ids import new_id
from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE, NewChain, StartedChain
from state_adapters.notifications import NotificationBuffer
from state_adapters.schema import UtcDateTime
from state_adapters.steps import schedule_ticks, starting

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from state_adapters.database import Database
    from state_adapters.transactions.calls import Transactions


class QueueOperations:
    """Retention and schedules of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions

    async def prune_chains(
        self, finished_before: datetime, *, batch_size: int = DEFAULT_PRUNE_BATCH_SIZE
    ) -> int:
        """One batch of retention, a transaction of its own; see
        :mod:`state_adapters.steps.pruning`."""
        validation.check_aware(finished_before, "finished_before")
        validation.check_positive_int(batch_size, "batch_size")
        return await self._transactions.write(
            None,
            NotificationBuffer(),
            lambda c, _n: self._db.prune_batch(c, finished_before, batch_size),
        )

    async def database_time(self) -> datetime:
        """The current instant on the database's clock (SQLite: this process's clock,
        which is SQLite's own): schedules' ticks are decided on it, and a worker compares
        it with its own clock at start."""
        query = select(self._db.sql.dialect.clock(bindparam("now", type_=UtcDateTime())))
        async with self._transactions.read(None) as conn:
            instant = await conn.scalar(query, {"now": datetime.now(UTC)})
        assert isinstance(instant, datetime)
        return instant

    async def take_schedule_tick(
        self, name: str, tick: datetime, chain: NewChain | None, *, notes: NotificationBuffer
    ) -> StartedChain | None:
        """Take a schedule's tick and start its chain in one transaction; see
        :mod:`state_adapters.steps.schedule_ticks`."""
        validation.check_schedule_name(name)
        validation.check_aware(tick, "tick")
        if chain is not None:
            validation.check_new_chain(chain)
            chain = replace(chain, id=chain.id or new_id())
        statements = schedule_ticks.ScheduleStatements(self._db.sql.tables, self._db.sql.dialect)

        async def take(conn: AsyncConnection, staged: NotificationBuffer) -> StartedChain | None:
            now = datetime.now(UTC)
            chain_id = None if chain is None else chain.id
            if not await schedule_ticks.take_tick(conn, statements, name, tick, chain_id, now):
                return None
            if chain is None:
                return None
            return (await starting.start(self._db, conn, staged, [chain], now))[0]

        return await self._transactions.write(None, notes, take)

    async def schedule_ticks(self, names: Sequence[str]) -> Mapping[str, datetime]:
        """The last tick recorded for each of these schedules that has one."""
        wanted = [validation.check_schedule_name(name) for name in dict.fromkeys(names)]
        statements = schedule_ticks.ScheduleStatements(self._db.sql.tables, self._db.sql.dialect)
        async with self._transactions.read(None) as conn:
            return await schedule_ticks.last_ticks(conn, statements, wanted)
