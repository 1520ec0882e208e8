"""The state adapter over SQLAlchemy's asyncio engine: Postgres (psycopg 3 or asyncpg) and
SQLite (aiosqlite).

Guarantees (the conformance suite in ``queuert_notify.testing`` checks them):

- a job is claimed by one caller at a time (row locks with ``SKIP LOCKED`` on
  Postgres, the ``BEGIN IMMEDIATE`` write lock on SQLite);
- every write a worker makes names its lease token; a stale token changes
  nothing and raises :class:`JobOwnershipLostError`;
- a chain becomes final once, in the transaction that finishes its last job,
  and that transaction also unblocks the jobs waiting on it;
- deduplication rides on a primary key, so racing starts make one chain;
- with ``session=`` every write joins the caller's transaction and is never
  committed here; notifications go to ``notes`` only when the call succeeded.

Each method checks its arguments, then runs named steps in a transaction:
starting (:mod:`state_adapters.steps.starting`), completing
(:mod:`state_adapters.steps.completion`), chains becoming final
(:mod:`state_adapters.steps.finishing`), chain actions (:mod:`state_adapters.steps.chain_actions`),
retention, schedule ticks and the worker registry
(:mod:`state_adapters.steps.operations`), the health
report (:mod:`state_adapters.steps.health`);
what differs between Postgres and SQLite is asked of the
:class:`~state_adapters.database.Database` chosen at construction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from state_adapters import arguments, storable, validation
from state_adapters.arguments import check_type_names, check_worker_id
from state_adapters.backoff import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, retry_delays
from state_adapters.database import check_supported, database_for
from state_adapters.errors import ConfigurationError, JobOwnershipLostError
from state_adapters.migrations import missing_tables
from state_adapters.migrations.schema_methods import SchemaMethods
from state_adapters.model import (
    Completion,
    FailureOutcome,
    JobRecord,
    NewChain,
    StartedChain,
)
from state_adapters.notifications import NotificationBuffer
from state_adapters.protocol import StateAdapter
from state_adapters.schema import DEFAULT_TABLE_PREFIX, make_tables
from state_adapters.sqlite.connections import SQLITE_SYNCHRONOUS, SqliteSynchronous
from state_adapters.statements.queue import Query
from state_adapters.steps import failing, starting
from state_adapters.steps.chain_actions import ChainActions
from state_adapters.steps.chain_reads import ChainReads
from state_adapters.steps.completion import claim_jobs, complete, ownership_lost
from state_adapters.steps.health import HealthCheck
from state_adapters.steps.inspection import Inspection
from state_adapters.steps.job_logs import JobLogMethods
from state_adapters.steps.operations import QueueOperations
from state_adapters.steps.type_controls import TypeControlMethods, TypeControls
from state_adapters.transactions.calls import Transactions
from state_adapters.transactions.connection_lanes import lanes_for
from state_adapters.transactions.handler_transaction import HandlerTransaction

if TYPE_CHECKING:
    from state_adapters.database import Conn
    from state_adapters.transactions.calls import CallerSession


class SqlAlchemyStateAdapter(
    SchemaMethods,
    ChainActions,
    ChainReads,
    HealthCheck,
    Inspection,
    JobLogMethods,
    QueueOperations,
    TypeControlMethods,
):
    """Job state in the application's own Postgres or SQLite database.

    ``engine`` stays the caller's (dispose it yourself); ``table_prefix`` and
    ``schema`` place the tables; ``backoff_base``/``backoff_cap`` (seconds)
    shape the retry delay after a failed attempt n:
    ``min(cap, base * 2 ** (n - 1))`` ± 10 %. Unsupported drivers raise
    :class:`ConfigurationError` here, not at the first query.

    SQLite only: the engine's connections get WAL, a long busy timeout and
    ``PRAGMA synchronous = sqlite_synchronous``. ``"NORMAL"`` (the default) keeps
    every commit through a crash or kill of the process but may lose the last
    commits to a power loss or OS crash; ``"FULL"`` syncs every commit to disk,
    about ten times slower per transaction.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        schema: str | None = None,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_cap: float = DEFAULT_BACKOFF_CAP,
        sqlite_synchronous: SqliteSynchronous = SQLITE_SYNCHRONOUS,
    ) -> None:
        check_supported(engine)  # before its dialect names the tables' database
        tables = make_tables(table_prefix, schema, dialects=(engine.dialect.name,))
        database = database_for(engine, tables, sqlite_synchronous=sqlite_synchronous)
        if not (0 <= backoff_base <= backoff_cap):
            raise ConfigurationError(
                f"need 0 <= backoff_base <= backoff_cap, got {backoff_base} and {backoff_cap}"
            )
        self.engine = engine
        self.tables = tables
        self.metadata = tables.metadata
        self.database = database
        """What differs between Postgres and SQLite (:mod:`state_adapters.database`)."""
        missing_tables.watch(engine, tables)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._db = database
        self._transactions = Transactions(engine, database)
        self._lanes = lanes_for(database.single_writer)
        self._controls = TypeControls(database, self._transactions, self._lanes)
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    # -- starting chains ---------------------------------------------------------------

    async def start_chains(
        self,
        chains: Sequence[NewChain],
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> list[StartedChain]:
        """Create chains atomically (all or none), in order; race-free deduplication.

        Everything is validated before the first write; unknown blocker chains
        raise :class:`ChainNotFoundError`, also before any write.
        """
        for chain in chains:
            validation.check_new_chain(chain)
        arguments.check_distinct_ids(chains)
        if not chains:
            return []
        plain = not any(c.dedup_key or c.blockers for c in chains)
        if session is None and (plain or self._db.starts_in_own_transaction):
            # Plain inserts are one statement on Postgres; on SQLite every start is one
            # call into the driver's thread. On a held connection (no checkout and return,
            # a call of its own on SQLite), kept for a start right after this one.
            staged = NotificationBuffer()
            async with self._lanes.connection(linger=True) as own:
                started = await self._db.in_transaction(
                    own, lambda conn: starting.start(self._db, conn, staged, chains, _now())
                )
            notes.absorb(staged)
            return started
        return await self._transactions.write(
            session, notes, lambda c, n: starting.start(self._db, c, n, chains, _now())
        )

    # -- acquisition and leases --------------------------------------------------------

    @property
    def completes_with_claims(self) -> bool:
        """Whether a worker should hand the completions waiting to be written to its next
        claim (:meth:`complete_and_acquire`) rather than write them alongside it.

        SQLite runs one writer at a time: a transaction saved is time saved. On
        Postgres the claim and the completions' write run at once on two connections,
        and so on two cores, which is faster than one after the other.
        """
        return self._db.completes_with_claims

    def handler_transaction(self) -> HandlerTransaction:
        """A session on the adapter's engine for one atomic-mode handler run."""
        return HandlerTransaction(self._sessions, self._controls.slots_freed)

    def connection_capacity(self) -> int | None:
        """The engine's ``pool_size`` (``None`` for a pool without one)."""
        size = getattr(self.engine.pool, "size", None)
        return size() if callable(size) else None

    def holding_connections(self) -> AbstractAsyncContextManager[None]:
        """While this is open, :meth:`acquire`, :meth:`complete_jobs` and plain
        :meth:`start_chains` (outside a caller's transaction) reuse up to two connections
        kept out of the pool instead of checking one out per call, which costs about as
        much as the claim itself.
        The two are per pool: every adapter and worker on one engine shares them, so
        however many workers run on an engine, they keep two of its connections
        between them. A :class:`~queuert_notify.Worker` holds them while it runs; size
        the pool for them (``pool_size`` >= concurrency + 4 with atomic handlers that
        use ``ctx.session``). Leaving the last hold gives back every connection kept,
        a plain start's for the next start too (``Client.close()``)."""
        return self._lanes.holding()

    async def acquire(
        self,
        type_names: Sequence[str],
        *,
        worker_id: str,
        lease_seconds: float,
        limit: int = 1,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` of the best eligible pending jobs of these types
        (priority, then scheduled_at, then id) in one statement; never hands one
        job to two callers. Each claim increments ``attempt`` and gets a fresh
        ``lease_token``. Paused types are left alone; limited ones are claimed first,
        within their limits (:mod:`state_adapters.steps.limited_claims`)."""
        types = _claimable(type_names, worker_id, lease_seconds, limit)
        if not types:
            return []
        return await self._acquiring(types, worker_id, lease_seconds, limit, _now())(None)

    def _claim(
        self,
        type_names: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
        now: datetime,
    ) -> Query | None:
        """The claim of these arguments (checked), or None when there is nothing to claim."""
        types = _claimable(type_names, worker_id, lease_seconds, limit)
        if not types:
            return None
        leased_until = now + timedelta(seconds=lease_seconds)
        return self._db.sql.claim(
            types, worker_id=worker_id, leased_until=leased_until, limit=int(limit), now=now
        )

    async def next_due_at(self, type_names: Sequence[str]) -> datetime | None:
        """Earliest ``scheduled_at`` of a pending job of these types (possibly in the past);
        for paused types none; for limited ones their due jobs too, except jobs this
        adapter's last claim held back, which count from when they may be claimable."""
        types = check_type_names(type_names)
        if not types:
            return None
        return await self._controls.next_due_at(types, _now())

    async def renew_lease(self, job_id: str, lease_token: str, lease_seconds: float) -> datetime:
        """Extend the lease to now + ``lease_seconds``; returns the new ``leased_until``.
        Raises ``JobOwnershipLostError`` for a stale token (nothing changed)."""
        validation.check_seconds(lease_seconds, "lease_seconds", allow_zero=False)
        until = _now() + timedelta(seconds=lease_seconds)
        await self._fenced(job_id, self._db.sql.renew_lease(job_id, lease_token, until))
        return until

    async def set_progress(self, job_id: str, lease_token: str, progress: Any) -> None:
        """Store progress (any JSON value); fenced by the lease token."""
        storable.check_json(progress, "progress")
        await self._fenced(job_id, self._db.sql.set_progress(job_id, lease_token, progress))

    async def _fenced(self, job_id: str, write: Query) -> None:
        """``write`` (fenced by a lease token, returning the rows it changed) in a
        transaction of its own, on a held connection when one is free; raises
        ``JobOwnershipLostError`` when it changed nothing."""

        compiled = self._db.compiled(write.statement)  # of fixed shape: renewals, progress

        async def step(conn: Conn) -> Any:
            changed = await compiled.rows(conn, write.params)
            return changed[0] if changed else None

        async with self._lanes.connection() as lane:
            if await self._db.in_transaction(lane, step) is None:
                raise ownership_lost(job_id)

    # -- finishing jobs ----------------------------------------------------------------

    async def complete_jobs(
        self,
        completions: Sequence[Completion],
        *,
        notes: NotificationBuffer,
        session: CallerSession = None,
    ) -> list[JobRecord | JobOwnershipLostError]:
        """Complete several leased jobs in one transaction.

        Per completion, in order: the completed job, or a ``JobOwnershipLostError``
        when its lease token is stale (nothing changed for that job). A
        ``continue_with`` creates the chain's next job; otherwise the chain
        completes and the jobs blocked on it are unblocked, all in this transaction.
        """
        validation.check_completions(completions)
        if not completions:
            return []
        if session is None:
            # On a held connection when a worker holds them. Postgres: one round trip
            # instead of BEGIN, the statement and COMMIT, unless a finished chain has
            # dependents to unblock (or a deadlock was detected): then a transaction.
            staged = NotificationBuffer()
            try:
                async with self._lanes.connection() as lane:
                    results, _ = await self._db.in_transaction(
                        lane, lambda conn: self._complete(conn, staged, completions, alone=True)
                    )
            except DBAPIError as exc:
                if not (self._db.needs_transaction(exc) or self._db.is_retryable(exc)):
                    raise
            else:
                notes.absorb(staged)
                self._controls.slots_freed()
                return results
        results, _ = await self._transactions.write(
            session, notes, lambda c, n: self._complete(c, n, completions)
        )
        self._controls.slots_freed()
        return results

    async def complete_and_acquire(
        self,
        completions: Sequence[Completion],
        *,
        notes: NotificationBuffer,
        type_names: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
    ) -> tuple[list[JobOwnershipLostError | None], list[JobRecord]]:
        """:meth:`complete_jobs` then :meth:`acquire` on one connection: what a worker's
        loop repeats, for a caller that only needs to know which completions held.

        Per completion ``None`` when it was written, or the ``JobOwnershipLostError``
        of a stale lease token, as :meth:`complete_jobs` decides (no job rows are read
        back); then the claimed jobs (``limit`` 0 claims nothing), which may include
        continuations the completions created. SQLite: one transaction. Postgres: the
        completion's statement commits, then the claim's.
        """
        validation.check_completions(completions)
        types = check_type_names(type_names)
        limited = limit > 0 and bool(await self._controls.limited(types))
        if limited and not (completions and self._db.completes_with_claims):
            # Limited types are claimed in transactions of their own, after the write.
            lost, _ = await self.complete_and_acquire(
                completions,
                notes=notes,
                type_names=type_names,
                worker_id=worker_id,
                lease_seconds=lease_seconds,
                limit=0,
            )
            claimed = await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
            return lost, claimed
        now = _now()
        claim: Any = self._claim(
            self._controls.uncontrolled(types), worker_id, lease_seconds, limit, now
        )
        if limited:  # SQLite: the limited claims join the completions' transaction
            claim = self._acquiring(types, worker_id, lease_seconds, limit, now)
        if not completions:
            return [], await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
        staged = NotificationBuffer()
        try:
            async with self._lanes.connection() as lane:
                done, claimed = await self._db.in_transaction(
                    lane,
                    lambda conn: self._complete(
                        conn, staged, completions, now, alone=True, records=False, claim=claim
                    ),
                )
        except DBAPIError as exc:
            if not (self._db.needs_transaction(exc) or self._db.is_retryable(exc)):
                raise
            # A finished chain has dependents (or a deadlock): the completions in a
            # transaction of their own, then the claim.
            done, _ = await self._transactions.write(
                None,
                notes,
                lambda c, n: self._complete(c, n, completions, records=False),
            )
            self._controls.slots_freed()
            claimed = await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
        else:
            notes.absorb(staged)
            if not limited:
                # A limited claim that ran in this transaction saw the freed slots.
                self._controls.slots_freed()
        lost = [r if isinstance(r, JobOwnershipLostError) else None for r in done]
        return lost, claimed

    def _acquiring(
        self, types: list[str], worker_id: str, lease_seconds: float, limit: int, now: datetime
    ) -> Callable[[Conn | None], Awaitable[list[JobRecord]]]:
        """:meth:`acquire` as a claim on a given connection (``None``: its own): the
        limited types first (:mod:`state_adapters.steps.type_controls`), then the plain claim."""

        def acquire(conn: Conn | None) -> Awaitable[list[JobRecord]]:
            async def plain(plain_types: Sequence[str], n: int) -> list[JobRecord]:
                claim = self._claim(plain_types, worker_id, lease_seconds, n, now)
                if claim is None:
                    return []
                if conn is not None:
                    return await claim_jobs(self._db, conn, claim)
                async with self._lanes.connection() as lane:
                    return await self._db.in_transaction(
                        lane, lambda own: claim_jobs(self._db, own, claim)
                    )

            until = now + timedelta(seconds=lease_seconds)
            return self._controls.acquire(
                types,
                plain,
                worker_id=worker_id,
                leased_until=until,
                limit=limit,
                now=now,
                conn=conn,
            )

        return acquire

    def _complete(
        self,
        conn: Conn,
        notes: NotificationBuffer,
        completions: Sequence[Completion],
        now: datetime | None = None,
        **options: Any,
    ) -> Awaitable[tuple[list[Any], list[JobRecord]]]:
        """:func:`~state_adapters.steps.completion.complete` on this adapter's database, waking
        workers for the limited types whose jobs wait for a slot."""
        limited = self._controls.limited_now()
        self._controls.slots_freed()
        return complete(
            self._db, conn, notes, completions, now or _now(), limited=limited, **options
        )

    async def fail_job(
        self,
        job_id: str,
        lease_token: str,
        error: str,
        *,
        notes: NotificationBuffer,
        retry_delay: float | None = None,
        final: bool = False,
    ) -> FailureOutcome:
        """Record a failed attempt: back to pending after the backoff for this
        attempt (or ``retry_delay`` seconds), or ``failed`` for good when
        ``max_attempts`` is used up or the failure is ``final`` (the chain then
        fails). Fenced by the token."""
        if retry_delay is not None:
            validation.check_seconds(retry_delay, "retry_delay", allow_zero=True)
        delays = (
            [retry_delay]
            if retry_delay is not None
            else retry_delays(self.backoff_base, self.backoff_cap)
        )
        self._controls.slots_freed()
        outcome = await self._transactions.write(
            None,
            notes,
            lambda c, n: failing.fail(
                self._db, c, n, job_id, lease_token, str(error), delays, final=final, now=_now()
            ),
        )
        self._controls.slots_freed()
        return outcome

    async def reap_expired_leases(
        self, type_names: Sequence[str] | None, *, notes: NotificationBuffer, limit: int = 100
    ) -> list[str]:
        """Return running jobs whose lease expired to pending (due now), or to
        failed when their attempts are used up; each exactly once even with
        overlapping reapers. Returns the reaped job ids."""
        types = None if type_names is None else check_type_names(type_names)
        if types == [] or limit < 1:
            return []
        return await self._transactions.write(
            None, notes, lambda c, n: failing.reap(self._db, c, n, types, limit, _now())
        )


def _now() -> datetime:
    return datetime.now(UTC)


def _claimable(
    type_names: Sequence[str], worker_id: str, lease_seconds: float, limit: int
) -> list[str]:
    """The type names a claim of these arguments (checked) asks for: none when it would
    claim nothing."""
    types = check_type_names(type_names)
    check_worker_id(worker_id)
    validation.check_seconds(lease_seconds, "lease_seconds", allow_zero=False)
    return types if limit >= 1 else []


if TYPE_CHECKING:  # mypy checks that the adapter has every capability the protocol declares
    _CONFORMS: type[StateAdapter] = SqlAlchemyStateAdapter
