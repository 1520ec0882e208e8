"""Paused and limited job types, as one adapter sees and changes them.

The database is the truth: a plain claim leaves paused and limited types alone in
its own SQL (:func:`state_adapters.statements.controlled_types.controlled`), and a limited
claim rereads the type's row under its lock. What this object caches -- which types
are limited, read at most once per :data:`REFRESH_SECONDS` -- only chooses the path:
a worker whose types are not limited keeps its one-statement claim, and a stale
cache at worst leaves a newly limited type unclaimed until the next refresh.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from state_adapters import validation
from state_adapters.model import JobRecord, TypeLimits
from state_adapters.notifications import NotificationBuffer
from state_adapters.statements.type_controls import TypeControlStatements
from state_adapters.steps.limited_claims import LimitedClaim, earliest, forgotten_starts

if TYPE_CHECKING:
    from state_adapters.database import Conn, Database
    from state_adapters.transactions.calls import CallerSession, Transactions
    from state_adapters.transactions.connection_lanes import ConnectionLanes

REFRESH_SECONDS = 1.0
"""How stale this adapter's list of limited types may be."""


class TypeControls:
    """Pause, resume and limits of job types, and the claims of limited types."""

    def __init__(self, db: Database, transactions: Transactions, lanes: ConnectionLanes) -> None:
        self._db = db
        self._transactions = transactions
        self._lanes = lanes
        self._sql = TypeControlStatements(db.sql.tables, db.sql.dialect)
        self._limited: frozenset[str] = frozenset()
        self._controlled: frozenset[str] = frozenset()
        self._paused: frozenset[str] = frozenset()
        self._loaded_at = float("-inf")
        self._retry_at: dict[str, datetime] = {}
        self._held: set[str] = set()
        self._frees = 0  # slots_freed calls so far: a claim that overlapped one holds nothing

    # -- what is set -------------------------------------------------------------------

    async def all(self, session: CallerSession = None) -> list[TypeLimits]:
        """Every paused or limited type, by name (read now, in ``session`` if given)."""
        async with self._transactions.read(session) as conn:
            rows = (await conn.execute(*self._sql.read_all())).all()
        controls = [_type_limits(row) for row in rows]
        self._remember(controls)
        return controls

    async def limited(self, type_names: Sequence[str]) -> list[str]:
        """The limited types among ``type_names`` (as read at most
        :data:`REFRESH_SECONDS` ago, or now when one of them was paused)."""
        age = time.monotonic() - self._loaded_at
        # A paused type is read again before every claim that asks for it: its resume
        # wakes workers at once, and a stale view would leave it out of their claims.
        if age >= REFRESH_SECONDS or (age > 0 and any(t in self._paused for t in type_names)):
            await self.all()
        return self.known_limited(type_names)

    def known_limited(self, type_names: Sequence[str]) -> list[str]:
        """The limited types among ``type_names`` as last read (no I/O)."""
        return [t for t in type_names if t in self._limited]

    def uncontrolled(self, type_names: Sequence[str]) -> list[str]:
        """The types among ``type_names`` neither paused nor limited as last read: the
        ones worth a plain claim (which would only skip the others' jobs one by one)."""
        return [t for t in type_names if t not in self._controlled]

    def limited_now(self) -> frozenset[str]:
        """The limited types whose last claim here held jobs back by ``concurrency`` or
        ``key_concurrency`` (no I/O): a completion of one frees a slot a waiting job
        wants, so it wakes a worker. (Otherwise no wake-up: a limit that does not bind
        costs no notifications.)"""
        return self._limited & self._held

    def _remember(self, controls: Sequence[TypeLimits]) -> None:
        self._limited = frozenset(c.type_name for c in controls if c.limited)
        self._controlled = frozenset(c.type_name for c in controls)
        self._paused = frozenset(c.type_name for c in controls if c.paused)
        self._loaded_at = time.monotonic()

    # -- changing them -----------------------------------------------------------------

    async def pause(
        self, type_name: str, notes: NotificationBuffer, session: CallerSession = None
    ) -> None:
        """Pause ``type_name``: no claim takes its jobs from the commit on."""
        type_name = validation.check_type_name(type_name)

        async def work(conn: AsyncConnection, _notes: NotificationBuffer) -> None:
            await conn.execute(*self._sql.ensure_row(type_name))
            await conn.execute(*self._sql.set_paused(type_name, True))

        await self._transactions.write(session, notes, work)
        self._loaded_at = float("-inf")

    async def resume(
        self,
        type_name: str,
        notes: NotificationBuffer,
        now: datetime,
        session: CallerSession = None,
    ) -> None:
        """Resume ``type_name`` and note its due jobs as scheduled, so that idle workers
        wake at once."""
        type_name = validation.check_type_name(type_name)

        async def work(conn: AsyncConnection, staged: NotificationBuffer) -> None:
            await conn.execute(*self._sql.set_paused(type_name, False))
            await conn.execute(*self._sql.delete_if_idle(type_name))
            await self._announce(conn, staged, type_name, now)

        await self._transactions.write(session, notes, work)
        self._loaded_at = float("-inf")

    async def paused(self, session: CallerSession = None) -> set[str]:
        """The types paused now."""
        return {c.type_name for c in await self.all(session) if c.paused}

    async def set_limits(
        self,
        type_name: str,
        *,
        concurrency: int | None,
        key_concurrency: int | None,
        rate: int | None,
        per_seconds: float | None,
        notes: NotificationBuffer,
        now: datetime,
        session: CallerSession = None,
    ) -> TypeLimits:
        """Replace the limits of ``type_name``; checked before anything is written.
        Notes the type's due jobs as scheduled (a limit raised or lifted frees slots)."""
        type_name = validation.check_type_name(type_name)
        concurrency, key_concurrency, rate, per_seconds = validation.check_limits(
            concurrency, key_concurrency, rate, per_seconds
        )
        limits = {
            "concurrency": concurrency,
            "key_concurrency": key_concurrency,
            "rate": rate,
            "per_seconds": per_seconds,
        }

        async def work(conn: AsyncConnection, staged: NotificationBuffer) -> TypeLimits:
            await conn.execute(*self._sql.ensure_row(type_name))
            before = (await conn.execute(*self._sql.read_one(type_name))).one()
            forgotten = forgotten_starts(before.rate, before.per_seconds, rate, per_seconds)
            await conn.execute(*self._sql.set_limits(type_name, limits, forgotten))
            await conn.execute(*self._sql.delete_if_idle(type_name))
            row = (await conn.execute(*self._sql.read_one(type_name))).first()
            await self._announce(conn, staged, type_name, now)
            return TypeLimits(type_name) if row is None else _type_limits(row)

        result = await self._transactions.write(session, notes, work)
        self._loaded_at = float("-inf")
        self._retry_at.pop(type_name, None)
        return result

    async def _announce(
        self, conn: AsyncConnection, notes: NotificationBuffer, type_name: str, now: datetime
    ) -> None:
        due = await conn.scalar(*self._sql.count_due(type_name, now))
        notes.job_scheduled(type_name, int(due or 0))

    # -- claims ------------------------------------------------------------------------

    async def acquire(
        self,
        type_names: Sequence[str],
        claim_plain: Callable[[Sequence[str], int], Awaitable[list[JobRecord]]],
        *,
        worker_id: str,
        leased_until: datetime,
        limit: int,
        now: datetime,
        conn: Conn | None = None,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` jobs of ``type_names``: the limited types first, within
        their limits, then the rest with ``claim_plain(types, limit)``, the one-statement
        claim, which leaves out the types this object knows are paused or limited (its
        SQL would skip their jobs one by one; with a stale view, it still leaves them
        alone). With ``conn`` (SQLite: the transaction of the completions the claim
        follows), every claim runs in it."""
        # With ``conn`` the caller has just read them, and on SQLite this runs in the
        # driver's thread, where nothing may wait for other I/O.
        limited = await self.limited(type_names) if conn is None else self.known_limited(type_names)
        plain = self.uncontrolled(type_names)
        jobs: list[JobRecord] = []
        if limited:
            jobs, stale = await self.claim(
                limited,
                worker_id=worker_id,
                leased_until=leased_until,
                limit=limit,
                now=now,
                conn=conn,
            )
            plain = list(type_names) if stale else plain
        if len(jobs) < limit and plain:
            jobs += await claim_plain(plain, limit - len(jobs))
        return jobs

    async def claim(
        self,
        type_names: Sequence[str],
        *,
        worker_id: str,
        leased_until: datetime,
        limit: int,
        now: datetime,
        conn: Conn | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """Claim up to ``limit`` jobs of these limited types, one type after the other,
        each in a transaction of its own (Postgres: one statement) or all in ``conn``'s
        (:mod:`state_adapters.steps.limited_claims`).
        Also says whether one of them turned out not to be limited any more."""
        jobs: list[JobRecord] = []
        stale = False
        for type_name in type_names:
            if len(jobs) >= limit:
                break
            frees = self._frees
            outcome = await self._claim_type(
                type_name, worker_id, leased_until, limit - len(jobs), now, conn
            )
            jobs.extend(outcome.jobs)
            stale = stale or outcome.uncontrolled
            if outcome.held:
                self._held.add(type_name)
            else:
                self._held.discard(type_name)
            if outcome.retry_at is None or frees != self._frees:
                # A job ended here while this claim ran: the slot it saw taken may be
                # free now, so its hold must not outlive that (the type stays due).
                self._retry_at.pop(type_name, None)
            else:
                self._retry_at[type_name] = outcome.retry_at
        if stale:
            self._loaded_at = float("-inf")
        return jobs, stale

    async def _claim_type(
        self,
        type_name: str,
        worker_id: str,
        leased_until: datetime,
        limit: int,
        now: datetime,
        within: Conn | None,
    ) -> LimitedClaim:
        async def claim(conn: Conn) -> LimitedClaim:
            return await self._db.claim_limited(
                conn,
                type_name,
                worker_id=worker_id,
                leased_until=leased_until,
                limit=limit,
                now=now,
            )

        if within is not None:
            return await claim(within)
        async with self._lanes.connection() as lane:
            return await self._db.in_transaction(lane, claim)

    async def next_due_at(self, type_names: Sequence[str], now: datetime) -> datetime | None:
        """The earliest ``scheduled_at`` of a pending job of ``type_names``, leaving out
        paused types (read in the statement): a limited type's due jobs are due. Only
        jobs this adapter's last claim held back wait: from then on their type counts
        its next job scheduled in the future, and the instant a rate window frees (or a
        recheck), until a job ends here (:meth:`slots_freed`)."""
        # Taken before any I/O: a completion may end a hold meanwhile.
        retry = {t: self._retry_at[t] for t in type_names if t in self._retry_at}
        held = list(retry)
        free = [t for t in type_names if t not in retry]
        due: datetime | None = None
        future: datetime | None = None
        async with self._db.reader.connect() as conn:
            if free:
                due = await conn.scalar(*self._db.sql.next_due_at(free))
            if held:
                future = await conn.scalar(*self._sql.next_scheduled(held, now))
        return earliest([due, future, *retry.values()])

    def slots_freed(self) -> None:
        """A job of this adapter ended (completed or failed): the types held back by
        ``concurrency`` or ``key_concurrency`` may have a free slot, so their due jobs
        are due again (a rate's hold stays: only time frees it). Called once the ending
        is written and again once it is committed: a claim that ran in between saw the
        slot still taken."""
        self._frees += 1
        for type_name in self._held:
            self._retry_at.pop(type_name, None)


def _type_limits(row: Any) -> TypeLimits:
    return TypeLimits(
        type_name=row.type_name,
        paused=bool(row.paused),
        concurrency=row.concurrency,
        key_concurrency=row.key_concurrency,
        rate=row.rate,
        per_seconds=row.per_seconds,
    )


class TypeControlMethods:
    """Pausing and limiting job types: the methods of
    :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter` (the :class:`StateAdapter`
    protocol's "operating the queue")."""

    _controls: TypeControls

    async def pause_type(
        self, type_name: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> None:
        """Stop every worker from claiming ``type_name`` (running jobs finish); stored,
        so workers started later leave it alone too. ``session``: the caller's
        transaction (``SyncClient``'s connection), else one of its own."""
        await self._controls.pause(type_name, notes, session)

    async def resume_type(
        self, type_name: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> None:
        """Let workers claim ``type_name`` again; its due jobs are noted as scheduled
        (counted up to 10,000), so idle workers wake at once."""
        await self._controls.resume(type_name, notes, datetime.now(UTC), session)

    async def paused_types(self, *, session: CallerSession = None) -> set[str]:
        """The types paused now."""
        return await self._controls.paused(session)

    async def set_limits(
        self,
        type_name: str,
        *,
        concurrency: int | None,
        key_concurrency: int | None,
        rate: int | None,
        per_seconds: float | None,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> TypeLimits:
        """Replace the limits of ``type_name`` (``None`` lifts one); bad values raise
        ``InvalidInputError`` before anything is written. Workers see new limits within
        a second; the type's due jobs are noted as scheduled."""
        return await self._controls.set_limits(
            type_name,
            concurrency=concurrency,
            key_concurrency=key_concurrency,
            rate=rate,
            per_seconds=per_seconds,
            notes=notes,
            now=datetime.now(UTC),
            session=session,
        )

    async def type_controls(self) -> list[TypeLimits]:
        """Every paused or limited type, by name."""
        return await self._controls.all()
