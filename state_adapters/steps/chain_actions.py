"""What an application does to a chain from outside a worker: cancel it, complete
it without a worker, retry it, make its pending job due now, delete it — each in
the caller's transaction or one of the adapter's own, with the notifications it owes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from state_adapters import storable
from state_adapters.arguments import check_key
from state_adapters.errors import ChainInUseError, ChainNotFoundError, InvalidInputError
from state_adapters.model import ChainRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.statements.records import chain_record
from state_adapters.steps.finishing import finalize_chains

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from state_adapters.database import Database
    from state_adapters.transactions.calls import CallerSession, Transactions


async def _finish(
    db: Database,
    conn: AsyncConnection,
    notes: NotificationBuffer,
    chain_id: str,
    status: str,
    output: Any,
    now: datetime,
) -> ChainRecord:
    """Move the chain's unfinished job to ``status`` (cancelled, or completed with
    ``output``); a worker running it loses ownership. A final chain is returned as is."""
    # Job rows first, then the chain row: the same lock order as a worker's
    # completion of the same job.
    unfinished = (await conn.execute(*db.chains.lock_unfinished_jobs(chain_id))).all()
    if unfinished:
        job_ids = [row.id for row in unfinished]
        await conn.execute(*db.chains.finish_jobs(job_ids, status, now, output))
        for row in unfinished:
            if row.status == "running":
                notes.ownership_lost(row.id)
        await finalize_chains(db, conn, notes, [chain_id], now)
    return await read_chain(db, conn, chain_id)


async def _retry(
    db: Database, conn: AsyncConnection, notes: NotificationBuffer, chain_id: str, now: datetime
) -> ChainRecord:
    """Run a failed or cancelled chain again from its last job, attempts starting
    over (blocked again while chains it waits on are unfinished)."""
    # The chain row first, then its jobs: the lock order of every other writer.
    if (await conn.execute(*db.chains.lock_chain(chain_id))).first() is None:
        raise chain_not_found(chain_id)
    last = (await conn.execute(*db.chains.last_job(chain_id))).one()
    if last.status not in ("failed", "cancelled"):
        raise InvalidInputError(
            f"chain {chain_id} is {last.status}: only a failed or cancelled chain can be retried"
        )
    waiting = len((await conn.execute(*db.chains.unfinished_blockers(last.id))).all())
    await conn.execute(*db.chains.retry_job(last.id, waiting, now))
    await conn.execute(*db.chains.reopen_chain(chain_id))
    if not waiting:
        notes.job_scheduled(last.type_name)
    return await read_chain(db, conn, chain_id)


async def _trigger(
    db: Database, conn: AsyncConnection, notes: NotificationBuffer, chain_id: str, now: datetime
) -> ChainRecord:
    """Make the chain's pending job due now (skipping a delay or a retry backoff)."""
    for row in await conn.execute(*db.chains.trigger_pending(chain_id, now)):
        notes.job_scheduled(row.type_name)
    return await read_chain(db, conn, chain_id)


async def _delete(db: Database, conn: AsyncConnection, chain_id: str) -> None:
    """Delete a chain, its jobs and its dedup key; ``ChainInUseError`` while jobs of
    other chains are blocked on it (nothing is deleted then)."""
    # The lock makes a concurrent start that blocks on this chain either
    # finish first (and be seen below) or find the chain gone.
    if (await conn.execute(*db.chains.lock_chain(chain_id))).first() is None:
        raise chain_not_found(chain_id)
    if await conn.scalar(*db.chains.blocked_dependents_exist(chain_id)):
        raise ChainInUseError(
            f"chain {chain_id} cannot be deleted: jobs of other chains are blocked on it; "
            "delete or cancel those chains first, or let this chain finish"
        )
    for query in db.chains.delete_chain(chain_id):
        await conn.execute(*query)


async def read_chain(db: Database, conn: AsyncConnection, chain_id: str) -> ChainRecord:
    """The chain as stored; ``ChainNotFoundError`` when there is none."""
    row = (await conn.execute(*db.chains.get_chain(chain_id))).mappings().first()
    if row is None:
        raise chain_not_found(chain_id)
    return chain_record(row)


def chain_not_found(chain_id: str) -> ChainNotFoundError:
    """The error of a chain id that names no chain."""
    return ChainNotFoundError(f"no chain with id {chain_id!r}")


class ChainActions:
    """The chain actions of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`:
    each checks its arguments, then runs its step in the caller's transaction or one of
    the adapter's own."""

    _db: Database
    _transactions: Transactions

    async def cancel_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Cancel the chain's unfinished job (blocked, pending or running; a
        running one's worker loses ownership). A final chain is returned as is."""
        check_key(chain_id, "chain_id")
        return await self._transactions.write(
            session,
            notes,
            lambda c, n: _finish(self._db, c, n, chain_id, "cancelled", None, _now()),
        )

    async def complete_chain(
        self,
        chain_id: str,
        output: Any,
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> ChainRecord:
        """Workerless completion: the chain's unfinished job completes with
        ``output`` (a worker running it loses ownership). A final chain is
        returned as is."""
        check_key(chain_id, "chain_id")
        storable.check_json(output, "output")
        return await self._transactions.write(
            session,
            notes,
            lambda c, n: _finish(self._db, c, n, chain_id, "completed", output, _now()),
        )

    async def retry_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Run a failed or cancelled chain again from its last job, with its attempts
        starting over (blocked again if chains it waits on are unfinished). Raises
        ``ChainNotFoundError``, or ``InvalidInputError`` for a chain that did not fail
        and was not cancelled."""
        check_key(chain_id, "chain_id")
        return await self._transactions.write(
            session, notes, lambda c, n: _retry(self._db, c, n, chain_id, _now())
        )

    async def trigger_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Make the chain's pending job due now (skipping a delay or a retry backoff)."""
        check_key(chain_id, "chain_id")
        return await self._transactions.write(
            session,
            notes,
            lambda c, n: _trigger(self._db, c, n, chain_id, _now()),
        )

    async def delete_chain(self, chain_id: str, *, session: CallerSession = None) -> None:
        """Delete a chain, its jobs and its dedup key; raises ``ChainInUseError``
        while jobs of other chains are blocked on it (nothing is deleted then)."""
        check_key(chain_id, "chain_id")
        await self._transactions.write(
            session,
            NotificationBuffer(),
            lambda c, _n: _delete(self._db, c, chain_id),
        )


def _now() -> datetime:
    return datetime.now(UTC)
