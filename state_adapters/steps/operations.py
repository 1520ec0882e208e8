"""Operating the queue: the state adapter's retention and schedule-tick methods, thin
callers of :mod:`state_adapters.steps.pruning` and :mod:`state_adapters.steps.schedule_ticks`;
and the worker registry.

The registry: each running worker's row in ``{prefix}workers``, and the job types whose
due jobs no live worker handles. A worker writes only its own row -- one statement when
it starts, one per heartbeat, one when it stops cleanly -- so the registry costs one
write per worker per reaper tick and nothing per job. A worker that died leaves its row
behind: it counts as dead once its heartbeat is older than
:data:`~state_adapters.model.WORKER_DEAD_AFTER`, and the next worker to start deletes
rows dead for :data:`PRUNE_AFTER`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, delete, func, insert, select, update

from state_adapters import validation
from state_adapters.arguments import check_worker_id
from state_adapters.ids import new_id
from state_adapters.model import DEFAULT_PRUNE_BATCH_SIZE, NewChain, StartedChain, WorkerRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.schema import UtcDateTime
from state_adapters.steps import schedule_ticks, starting

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from state_adapters.database import Database
    from state_adapters.transactions.calls import CallerSession, Transactions


PRUNE_AFTER = timedelta(days=1)
"""How long a dead worker's row stays visible (as dead) before a starting worker
deletes it."""


class WorkerRegistryMethods:
    """The registry methods of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions

    async def record_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        type_names: Sequence[str],
        slots: int,
        starting: bool = False,
    ) -> None:
        """Write the worker's row with a fresh heartbeat: one UPDATE of its own row;
        when ``starting``, its row is (re)created instead, and long-dead rows are
        deleted."""
        check_worker_id(worker_id)
        workers = self._db.sql.tables.workers
        now = datetime.now(UTC)

        async def beat(conn: AsyncConnection, _notes: NotificationBuffer) -> None:
            if not starting:
                found = await conn.execute(
                    update(workers).where(workers.c.id == worker_id).values(heartbeat_at=now)
                )
                if found.rowcount:
                    return
            else:
                await conn.execute(
                    delete(workers).where(
                        (workers.c.id == worker_id) | (workers.c.heartbeat_at < now - PRUNE_AFTER)
                    )
                )
            await conn.execute(
                insert(workers).values(
                    id=worker_id,
                    host=host,
                    pid=pid,
                    type_names=list(type_names),
                    slots=slots,
                    started_at=now,
                    heartbeat_at=now,
                )
            )

        await self._transactions.write(None, NotificationBuffer(), beat)

    async def forget_worker(self, worker_id: str) -> None:
        """Delete the worker's row (a clean stop)."""
        check_worker_id(worker_id)
        workers = self._db.sql.tables.workers

        async def forget(conn: AsyncConnection, _notes: NotificationBuffer) -> None:
            await conn.execute(delete(workers).where(workers.c.id == worker_id))

        await self._transactions.write(None, NotificationBuffer(), forget)

    async def workers(self, *, session: CallerSession = None) -> list[WorkerRecord]:
        """Every recorded worker, live or dead, oldest first."""
        workers = self._db.sql.tables.workers
        query = select(workers).order_by(workers.c.started_at, workers.c.id)
        async with self._transactions.read(session) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            WorkerRecord(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                type_names=tuple(row["type_names"]),
                slots=row["slots"],
                started_at=row["started_at"],
                heartbeat_at=row["heartbeat_at"],
            )
            for row in rows
        ]

    async def due_jobs_by_type(self, *, session: CallerSession = None) -> Mapping[str, int]:
        """Pending jobs due now, per type (only the types that have some)."""
        jobs = self._db.sql.tables.jobs
        query = (
            select(jobs.c.type_name, func.count())
            .where(jobs.c.status == "pending", jobs.c.scheduled_at <= datetime.now(UTC))
            .group_by(jobs.c.type_name)
        )
        async with self._transactions.read(session) as conn:
            return {type_name: int(count) for type_name, count in await conn.execute(query)}


class QueueOperations(WorkerRegistryMethods):
    """Retention, schedules and the worker registry of
    :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions

    async def prune_chains(
        self,
        finished_before: datetime,
        *,
        batch_size: int = DEFAULT_PRUNE_BATCH_SIZE,
        session: CallerSession = None,
    ) -> int:
        """One batch of retention, a transaction of its own (or ``session``'s); see
        :mod:`state_adapters.steps.pruning`."""
        validation.check_aware(finished_before, "finished_before")
        validation.check_positive_int(batch_size, "batch_size")
        return await self._transactions.write(
            session,
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
