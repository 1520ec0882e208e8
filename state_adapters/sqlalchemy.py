"""The state adapter over SQLAlchemy's asyncio engine: Postgres (psycopg 3) and SQLite (aiosqlite).

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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.sql import ClauseElement

from state_adapters import dialects, missing_tables, validation
from state_adapters.after_commit import wrong_session
from state_adapters.backoff import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, retry_delays
from state_adapters.compiled import CompiledStatement
from state_adapters.connection_lanes import lanes_for
from state_adapters.errors import (
    ChainInUseError,
    ChainNotFoundError,
    ConfigurationError,
    InvalidInputError,
    JobNotFoundError,
    JobOwnershipLostError,
)
from state_adapters.handler_transaction import HandlerTransaction
from state_adapters.ids import new_id
from state_adapters.notifications import NotificationBuffer
from state_adapters.protocol import (
    ALL_STATUSES,
    ChainRecord,
    Completion,
    FailureOutcome,
    JobRecord,
    JobStatus,
    NewChain,
    Page,
    StartedChain,
    StateAdapter,
)
from state_adapters.records import chain_record, job_record, job_row, next_job_row
from state_adapters.schema import (
    DEFAULT_TABLE_PREFIX,
    WORKER_ID_LENGTH,
    make_tables,
)
from state_adapters.sql_dialect import sql_dialect
from state_adapters.sqlite_driver import DriverTransaction, driver_transaction
from state_adapters.statements import JOB_FIELDS, Statements
from state_adapters.sync_bridge import SyncConnection

if TYPE_CHECKING:
    CallerSession = AsyncSession | AsyncConnection | SyncConnection | None

logger = logging.getLogger(__name__)

T = TypeVar("T")
_Conn = AsyncConnection | DriverTransaction
"""Where a worker's statements run: a SQLAlchemy connection, or on SQLite the driver."""

MAX_PAGE_SIZE = 10_000
_IDS_PER_READ = 1000
"""Ids bound in one ``IN (...)`` read: far below every driver's parameter limit."""
_MAX_TRANSACTION_RETRIES = 5
_DEDUP_ATTEMPTS = 20


class SqlAlchemyStateAdapter:
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
        sqlite_synchronous: dialects.SqliteSynchronous = dialects.SQLITE_SYNCHRONOUS,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise ConfigurationError(
                "SqlAlchemyStateAdapter needs an AsyncEngine "
                "(sqlalchemy.ext.asyncio.create_async_engine), "
                f"got {type(engine).__name__}"
            )
        dialects.check_supported(engine)
        if not (0 <= backoff_base <= backoff_cap):
            raise ConfigurationError(
                f"need 0 <= backoff_base <= backoff_cap, got {backoff_base} and {backoff_cap}"
            )
        dialects.configure_engine(engine, synchronous=sqlite_synchronous)
        self.engine = engine
        self.tables = make_tables(table_prefix, schema)
        self.metadata = self.tables.metadata
        missing_tables.watch(engine, self.tables)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._postgres = dialects.is_postgres(engine)
        self._sql = Statements(self.tables, sql_dialect(self._postgres))
        self._reader = dialects.reader(engine)
        self._single_writer = dialects.single_writer(engine)
        self._lanes = lanes_for(self._single_writer)
        # What workers and producers repeat is compiled once (see _compiled).
        self._compiled_statements: dict[ClauseElement, CompiledStatement] = {}
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    # -- schema ------------------------------------------------------------------------

    async def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the tables to the latest shipped migration.

        Idempotent, and safe when several processes run it at once: they take
        turns (Postgres advisory lock, SQLite write lock) and all but the first
        find nothing to do. Queue tables created by someone else (the application's
        own Alembic) are a :class:`ConfigurationError`; with ``adopt`` they are
        checked against the newest migration and, when they match, taken over by
        stamping the version table (see docs/databases.md).
        """
        from state_adapters.migrations.runner import upgrade

        async with self.engine.begin() as connection:
            await dialects.take_migration_lock(
                connection, f"{self.tables.schema}.{self.tables.table_prefix}"
            )
            await connection.run_sync(upgrade, self.tables, adopt=adopt)

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
        _check_distinct_ids(chains)
        if not chains:
            return []
        if session is None and not any(c.dedup_key or c.blockers for c in chains):
            # Plain inserts: one statement on Postgres, run as its own transaction.
            staged = NotificationBuffer()
            async with self._single_writer.connect() as own, self._transaction(own) as conn:
                started = await self._start(conn, staged, chains)
            notes.absorb(staged)
            return started
        return await self._write(session, notes, lambda c, n: self._start(c, n, chains))

    async def _start(
        self, conn: _Conn, notes: NotificationBuffer, chains: Sequence[NewChain]
    ) -> list[StartedChain]:
        """Insert the chains; only plain ones (no dedup key, no blockers) may be given a
        :class:`DriverTransaction`, whose statements must have one shape each."""
        now = _now()
        blocker_ids = {b for chain in chains for b in chain.blockers}
        open_blockers: set[str] = set()
        if blocker_ids:
            assert not isinstance(conn, DriverTransaction)
            rows = (await conn.execute(*self._sql.mark_dependents(list(blocker_ids)))).all()
            found = {row.id for row in rows}
            missing = sorted(blocker_ids - found)
            if missing:
                raise ChainNotFoundError(
                    f"blocker chain(s) {', '.join(missing)} do not exist; "
                    "pass ids of chains that were started (and not deleted)"
                )
            # The statement above only flagged existing chains as having
            # dependents, which is harmless if this start goes no further.
            open_blockers = {row.id for row in rows if row.completed_at is None}
        started: list[StartedChain] = []
        job_rows: list[dict[str, Any]] = []
        blocker_rows: list[dict[str, Any]] = []
        scheduled: dict[str, int] = {}
        ids = [chain.id or new_id() for chain in chains]
        holders: dict[tuple[str, str], str] = {}
        if any(chain.dedup_key is not None for chain in chains):
            assert not isinstance(conn, DriverTransaction)
            holders = await self._take_dedup_keys(conn, chains, ids, now)
        for chain, chain_id in zip(chains, ids, strict=True):
            job = chain.job
            if chain.dedup_key is not None:
                holder = holders[(job.type_name, chain.dedup_key)]
                if holder != chain_id:
                    started.append(StartedChain(holder, job.type_name, deduplicated=True))
                    continue
            waiting_on = 0
            if chain.blockers:
                waiting_on = sum(1 for b in set(chain.blockers) if b in open_blockers)
                blocker_rows.extend(
                    {"job_id": chain_id, "blocker_chain_id": b}
                    for b in dict.fromkeys(chain.blockers)
                )
            job_rows.append(
                job_row(
                    job,
                    job_id=chain_id,
                    chain_id=chain_id,
                    chain_index=0,
                    now=now,
                    dedup_key=chain.dedup_key,
                    blockers_pending=waiting_on,
                )
            )
            if waiting_on == 0:
                scheduled[job.type_name] = scheduled.get(job.type_name, 0) + 1
            started.append(StartedChain(chain_id, job.type_name, deduplicated=False))
        if job_rows:
            for statement, params in self._sql.insert_chains_and_jobs(job_rows):
                if self._postgres and statement is self._sql.insert_first_jobs:
                    await self._compiled(statement).rows(conn, params)
                else:
                    await conn.execute(statement, params)
        if blocker_rows:
            await conn.execute(self.tables.blockers.insert(), blocker_rows)
        for type_name, count in scheduled.items():
            notes.job_scheduled(type_name, count)
        return started

    async def _take_dedup_keys(
        self,
        conn: AsyncConnection,
        chains: Sequence[NewChain],
        ids: Sequence[str],
        now: datetime,
    ) -> dict[tuple[str, str], str]:
        """For every dedup key of the batch, the chain that answers it: an existing
        chain, or the first chain of this batch with that key (which then holds it).
        Keys are taken in sorted order, so two batches never wait on each other in
        a cycle."""
        first: dict[tuple[str, str], tuple[NewChain, str]] = {}
        for chain, chain_id in zip(chains, ids, strict=True):
            if chain.dedup_key is not None:
                first.setdefault((chain.job.type_name, chain.dedup_key), (chain, chain_id))
        holders: dict[tuple[str, str], str] = {}
        for key in sorted(first):
            chain, chain_id = first[key]
            existing = await self._take_dedup_key(conn, chain, chain_id, now)
            holders[key] = chain_id if existing is None else existing
        return holders

    async def _take_dedup_key(
        self, conn: AsyncConnection, chain: NewChain, chain_id: str, now: datetime
    ) -> str | None:
        """Make ``chain_id`` the holder of the chain's dedup key, or return the id of
        the existing chain that deduplicates it."""
        type_name, key = chain.job.type_name, chain.dedup_key
        assert key is not None
        row_values = {"type_name": type_name, "dedup_key": key, "chain_id": chain_id}
        for _ in range(_DEDUP_ATTEMPTS):
            taken = await conn.execute(
                self._sql.insert_dedup_key(), {**row_values, "created_at": now}
            )
            if taken.first() is not None:
                return None
            # Someone holds the key. A statement of its own sees the holder even
            # when its transaction committed while our INSERT waited for it.
            holder = (await conn.execute(self._sql.read_dedup_key(type_name, key))).first()
            if holder is None:
                continue  # the holder was deleted meanwhile: try to insert again
            if holder.existing_id is not None and _deduplicates(chain, holder, now):
                return str(holder.chain_id)
            moved = await conn.execute(
                self._sql.move_dedup_key(type_name, key, holder.chain_id, chain_id, now)
            )
            if moved.first() is not None:
                return None
        raise RuntimeError(f"dedup key {key!r} kept changing hands; giving up")

    # -- acquisition and leases --------------------------------------------------------

    @property
    def completes_with_claims(self) -> bool:
        """Whether a worker should hand the completions waiting to be written to its next
        claim (:meth:`complete_and_acquire`) rather than write them alongside it.

        SQLite runs one writer at a time: a transaction saved is time saved. On
        Postgres the claim and the completions' write run at once on two connections,
        and so on two cores, which is faster than one after the other.
        """
        return not self._postgres

    def handler_transaction(self) -> HandlerTransaction:
        """A session on the adapter's engine for one atomic-mode handler run."""
        return HandlerTransaction(self._sessions)

    def connection_capacity(self) -> int | None:
        """The engine's ``pool_size`` (``None`` for a pool without one)."""
        size = getattr(self.engine.pool, "size", None)
        return size() if callable(size) else None

    def holding_connections(self) -> AbstractAsyncContextManager[None]:
        """While this is open, :meth:`acquire` and :meth:`complete_jobs` (outside a
        caller's transaction) reuse up to two connections kept out of the pool instead
        of checking one out per call, which costs about as much as the claim itself.
        The two are per pool: every adapter and worker on one engine shares them, so
        however many workers run on an engine, they keep two of its connections
        between them. A :class:`~queuert_notify.Worker` holds them while it runs; size
        the pool for them (``pool_size`` >= concurrency + 4 with atomic handlers that
        use ``ctx.session``)."""
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
        ``lease_token``."""
        claim = _claim_params(type_names, worker_id, lease_seconds, limit, _now())
        if not claim["limit"]:
            return []
        async with self._lanes.connection() as lane, self._transaction(lane) as conn:
            return await self._claim(conn, claim)

    def _transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[_Conn]:
        """A transaction of the adapter's own on ``conn`` for the statements it repeats
        (claims, completions, plain starts): on SQLite sent to the driver itself (see
        :mod:`state_adapters.sqlite_driver`)."""
        if self._postgres:
            return _begun(conn)
        return driver_transaction(conn, self._compiled)

    def _compiled(self, statement: ClauseElement) -> CompiledStatement:
        """``statement`` compiled once for this engine (statements of fixed shape only)."""
        compiled = self._compiled_statements.get(statement)
        if compiled is None:
            compiled = CompiledStatement(statement, self.engine.dialect)
            self._compiled_statements[statement] = compiled
        return compiled

    async def _claim(self, conn: _Conn, claim: Mapping[str, Any]) -> list[JobRecord]:
        """Run the claim statement with :func:`_claim_params`'s parameters."""
        statement = self._sql.claim(claim["type_count"], claim["limit"])
        rows = await self._compiled(statement).rows(conn, claim)
        return _claimed([JobRecord(*row) for row in rows])

    async def next_due_at(self, type_names: Sequence[str]) -> datetime | None:
        """Earliest ``scheduled_at`` of a pending job of these types (possibly in the past)."""
        types = _check_type_names(type_names)
        if not types:
            return None
        async with self._reader.connect() as conn:
            result: datetime | None = await conn.scalar(
                self._sql.next_due_at, {"type_names": types}
            )
        return result

    async def renew_lease(self, job_id: str, lease_token: str, lease_seconds: float) -> datetime:
        """Extend the lease to now + ``lease_seconds``; returns the new ``leased_until``.
        Raises ``JobOwnershipLostError`` for a stale token (nothing changed)."""
        validation.check_seconds(lease_seconds, "lease_seconds", allow_zero=False)
        until = _now() + timedelta(seconds=lease_seconds)
        params = {"job_id": job_id, "b_lease_token": lease_token, "b_leased_until": until}
        async with self._single_writer.begin() as conn:
            renewed = (await conn.execute(self._sql.renew_lease, params)).first()
        if renewed is None:
            raise _ownership_lost(job_id)
        return until

    async def set_progress(self, job_id: str, lease_token: str, progress: Any) -> None:
        """Store progress (any JSON value); fenced by the lease token."""
        validation.check_json(progress, "progress")
        params = {"job_id": job_id, "b_lease_token": lease_token, "b_progress": progress}
        async with self._single_writer.begin() as conn:
            stored = (await conn.execute(self._sql.set_progress, params)).first()
        if stored is None:
            raise _ownership_lost(job_id)

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
                async with self._lanes.connection() as lane, self._transaction(lane) as conn:
                    results, _ = await self._complete(
                        conn, staged, completions, alone=self._postgres
                    )
            except DBAPIError as exc:
                if not (dialects.needs_transaction(exc) or dialects.is_retryable(exc)):
                    raise
            else:
                notes.absorb(staged)
                return results
        results, _ = await self._write(
            session, notes, lambda c, n: self._complete(c, n, completions)
        )
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
        now = _now()
        claim = _claim_params(type_names, worker_id, lease_seconds, limit, now)
        if not completions:
            return [], await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
        staged = NotificationBuffer()
        try:
            async with self._lanes.connection() as lane, self._transaction(lane) as conn:
                done, claimed = await self._complete(
                    conn, staged, completions, now=now, alone=self._postgres, claim=claim
                )
        except DBAPIError as exc:
            if not (dialects.needs_transaction(exc) or dialects.is_retryable(exc)):
                raise
            # A finished chain has dependents (or a deadlock): the completions in a
            # transaction of their own, then the claim.
            nothing = {**claim, "limit": 0}
            done, _ = await self._write(
                None, notes, lambda c, n: self._complete(c, n, completions, claim=nothing)
            )
            claimed = await self.acquire(
                type_names, worker_id=worker_id, lease_seconds=lease_seconds, limit=limit
            )
        else:
            notes.absorb(staged)
        lost = [r if isinstance(r, JobOwnershipLostError) else None for r in done]
        return lost, claimed

    async def _complete(
        self,
        conn: _Conn,
        notes: NotificationBuffer,
        completions: Sequence[Completion],
        *,
        now: datetime | None = None,
        alone: bool = False,
        claim: Mapping[str, Any] | None = None,
    ) -> tuple[list[Any], list[JobRecord]]:
        """Complete ``completions``: per completion the completed job (a ``JobRecord``;
        with ``claim``, only its id and chain position) or a ``JobOwnershipLostError``;
        with ``claim``, then claim as :meth:`acquire` with those parameters."""
        now = now or _now()
        first: dict[str, Completion] = {}
        for completion in completions:
            first.setdefault(completion.job_id, completion)
        # The next job of every continued chain, created only if its
        # predecessor's completion holds.
        next_jobs = [
            next_job_row(c.continue_with.job, previous_id=c.job_id, now=now)
            for c in first.values()
            if c.continue_with is not None
        ]
        records = claim is None
        if self._postgres:
            done, finalized = await self._complete_in_one_statement(
                conn, first, next_jobs, now, alone=alone, records=records
            )
        else:
            done, finalized = await self._complete_step_by_step(
                conn, first, next_jobs, now, records=records
            )
        for row in next_jobs:
            if row["previous_id"] in done:
                notes.job_scheduled(row["type_name"])
        await self._after_finalizing(conn, notes, finalized)
        claimed: list[JobRecord] = []
        if claim is not None and claim["limit"]:
            claimed = await self._claim(conn, claim)
        results: list[Any] = []
        seen: set[str] = set()
        for completion in completions:
            record = done.get(completion.job_id)
            if record is None or completion.job_id in seen:
                results.append(_ownership_lost(completion.job_id))
            else:
                results.append(record)
                seen.add(completion.job_id)
        return results, claimed

    async def _complete_in_one_statement(
        self,
        conn: _Conn,
        first: Mapping[str, Completion],
        next_jobs: Sequence[Mapping[str, Any]],
        now: datetime,
        *,
        alone: bool,
        records: bool,
    ) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
        completions = [
            (c.job_id, c.lease_token, None if c.continue_with else c.output, not c.continue_with)
            for c in first.values()
        ]
        statement, params = self._sql.complete_in_one_statement(
            completions, next_jobs, now, alone=alone
        )
        rows = (
            await conn.execute(statement, params)
            if records
            else await self._compiled(self._sql.complete_ids_statement).rows(conn, params)
        )
        done: dict[str, Any] = {}
        finalized: list[tuple[str, bool]] = []
        for row in rows:
            # The job's columns, then the chain it made final and whether jobs wait on it.
            done[row[0]] = JobRecord(*row[:_JOB_WIDTH]) if records else True
            _note_final(finalized, *row[_JOB_WIDTH : _JOB_WIDTH + 2])
        return done, finalized

    async def _complete_step_by_step(
        self,
        conn: _Conn,
        first: Mapping[str, Completion],
        next_jobs: Sequence[Mapping[str, Any]],
        now: datetime,
        *,
        records: bool,
    ) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
        statement = self._sql.complete_leased(
            [
                (c.job_id, c.lease_token, None if c.continue_with else c.output)
                for c in first.values()
            ],
            now,
            records=records,
        )
        done: dict[str, Any] = {
            row.id: JobRecord(*row) if records else row for row in await conn.execute(*statement)
        }
        created = []
        for next_job in next_jobs:
            new = dict(next_job)
            previous = done.get(new.pop("previous_id"))
            if previous is not None:
                new.update(chain_id=previous.chain_id, chain_index=previous.chain_index + 1)
                created.append(new)
        if created:
            await conn.execute(self._sql.insert_jobs, created)
        finishing = [
            done[job_id].chain_id
            for job_id, c in first.items()
            if c.continue_with is None and job_id in done
        ]
        return done, await self._finalize(conn, finishing, now)

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
        return await self._write(
            None,
            notes,
            lambda c, n: self._fail(c, n, job_id, lease_token, str(error), retry_delay, final),
        )

    async def _fail(
        self,
        conn: AsyncConnection,
        notes: NotificationBuffer,
        job_id: str,
        lease_token: str,
        error: str,
        retry_delay: float | None,
        final: bool,
    ) -> FailureOutcome:
        now = _now()
        delays = (
            [retry_delay]
            if retry_delay is not None
            else retry_delays(self.backoff_base, self.backoff_cap)
        )
        statement = self._sql.fail_leased(
            job_id, lease_token, error, self._sql.retry_at(delays, now), final=final
        )
        row = (await conn.execute(statement, {"now": now})).first()
        if row is None:
            raise _ownership_lost(job_id)
        if row.status == "failed":
            await self._finalize_chains(conn, notes, [row.chain_id], now)
            return FailureOutcome("failed", None)
        notes.job_scheduled(row.type_name)
        return FailureOutcome("pending", row.scheduled_at)

    async def reap_expired_leases(
        self, type_names: Sequence[str] | None, *, notes: NotificationBuffer, limit: int = 100
    ) -> list[str]:
        """Return running jobs whose lease expired to pending (due now), or to
        failed when their attempts are used up; each exactly once even with
        overlapping reapers. Returns the reaped job ids."""
        types = None if type_names is None else _check_type_names(type_names)
        if types == [] or limit < 1:
            return []
        return await self._write(None, notes, lambda c, n: self._reap(c, n, types, limit))

    async def _reap(
        self,
        conn: AsyncConnection,
        notes: NotificationBuffer,
        types: list[str] | None,
        limit: int,
    ) -> list[str]:
        now = _now()
        rows = (await conn.execute(*self._sql.reap_expired(types, limit, now))).all()
        failed_chains = []
        for row in rows:
            notes.ownership_lost(row.id)
            if row.status == "failed":
                failed_chains.append(row.chain_id)
            else:
                notes.job_scheduled(row.type_name)
        await self._finalize_chains(conn, notes, failed_chains, now)
        if rows:
            logger.info(
                "reaped expired leases",
                extra={"job_ids": [row.id for row in rows], "count": len(rows)},
            )
        return [row.id for row in rows]

    async def _finalize_chains(
        self,
        conn: AsyncConnection,
        notes: NotificationBuffer,
        chain_ids: Sequence[str],
        now: datetime,
    ) -> None:
        """Mark chains final (once) and unblock what waited on them."""
        await self._after_finalizing(conn, notes, await self._finalize(conn, chain_ids, now))

    async def _finalize(
        self, conn: _Conn, chain_ids: Sequence[str], now: datetime
    ) -> list[tuple[str, bool]]:
        """Mark chains final (once); (chain id, has dependents) of those that were not."""
        if not chain_ids:
            return []
        rows = await conn.execute(*self._sql.finalize_chains(chain_ids, now))
        return [(row.id, bool(row.has_dependents)) for row in rows]

    async def _after_finalizing(
        self,
        conn: _Conn,
        notes: NotificationBuffer,
        finalized: Sequence[tuple[str, bool]],
    ) -> None:
        """Announce newly final chains and release the jobs that waited on them.

        Runs as a statement of its own after the chains were made final, so it
        sees every blocked job committed while their rows were being locked.
        """
        for chain_id, _ in finalized:
            notes.chain_completed(chain_id)
        waited_on = [chain_id for chain_id, has_dependents in finalized if has_dependents]
        if not waited_on:
            return
        for row in await conn.execute(*self._sql.unblock_dependents(waited_on)):
            if row.status == "pending":
                notes.job_scheduled(row.type_name)

    # -- application-side chain actions ------------------------------------------------

    async def cancel_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Cancel the chain's unfinished job (blocked, pending or running; a
        running one's worker loses ownership). A final chain is returned as is."""
        _check_key(chain_id, "chain_id")
        return await self._write(
            session, notes, lambda c, n: self._finish_chain(c, n, chain_id, "cancelled", None)
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
        _check_key(chain_id, "chain_id")
        validation.check_json(output, "output")
        return await self._write(
            session, notes, lambda c, n: self._finish_chain(c, n, chain_id, "completed", output)
        )

    async def _finish_chain(
        self,
        conn: AsyncConnection,
        notes: NotificationBuffer,
        chain_id: str,
        status: str,
        output: Any,
    ) -> ChainRecord:
        now = _now()
        # Job rows first, then the chain row: the same lock order as a worker's
        # completion of the same job.
        unfinished = (await conn.execute(self._sql.lock_unfinished_jobs(chain_id))).all()
        if unfinished:
            await conn.execute(
                self._sql.finish_jobs([row.id for row in unfinished], status, now, output)
            )
            for row in unfinished:
                if row.status == "running":
                    notes.ownership_lost(row.id)
            await self._finalize_chains(conn, notes, [chain_id], now)
        return await self._get_chain(conn, chain_id)

    async def retry_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Run a failed or cancelled chain again from its last job, with its attempts
        starting over (blocked again if chains it waits on are unfinished). Raises
        ``ChainNotFoundError``, or ``InvalidInputError`` for a chain that did not fail
        and was not cancelled."""
        _check_key(chain_id, "chain_id")
        return await self._write(session, notes, lambda c, n: self._retry(c, n, chain_id))

    async def _retry(
        self, conn: AsyncConnection, notes: NotificationBuffer, chain_id: str
    ) -> ChainRecord:
        # The chain row first, then its jobs: the lock order of every other writer.
        if (await conn.execute(self._sql.lock_chain(chain_id))).first() is None:
            raise _chain_not_found(chain_id)
        last = (await conn.execute(self._sql.last_job(chain_id))).one()
        if last.status not in ("failed", "cancelled"):
            raise InvalidInputError(
                f"chain {chain_id} is {last.status}: only a failed or cancelled chain can be "
                "retried"
            )
        waiting = len((await conn.execute(self._sql.unfinished_blockers(last.id))).all())
        await conn.execute(self._sql.retry_job(last.id, waiting, _now()))
        await conn.execute(self._sql.reopen_chain(chain_id))
        if not waiting:
            notes.job_scheduled(last.type_name)
        return await self._get_chain(conn, chain_id)

    async def trigger_chain(
        self, chain_id: str, *, notes: NotificationBuffer, session: CallerSession = None
    ) -> ChainRecord:
        """Make the chain's pending job due now (skipping a delay or a retry backoff)."""
        _check_key(chain_id, "chain_id")
        return await self._write(session, notes, lambda c, n: self._trigger(c, n, chain_id))

    async def _trigger(
        self, conn: AsyncConnection, notes: NotificationBuffer, chain_id: str
    ) -> ChainRecord:
        for row in await conn.execute(self._sql.trigger_pending(chain_id, _now())):
            notes.job_scheduled(row.type_name)
        return await self._get_chain(conn, chain_id)

    async def delete_chain(self, chain_id: str, *, session: CallerSession = None) -> None:
        """Delete a chain, its jobs and its dedup key; raises ``ChainInUseError``
        while jobs of other chains are blocked on it (nothing is deleted then)."""
        _check_key(chain_id, "chain_id")
        await self._write(session, NotificationBuffer(), lambda c, _n: self._delete(c, chain_id))

    async def _delete(self, conn: AsyncConnection, chain_id: str) -> None:
        # The lock makes a concurrent start that blocks on this chain either
        # finish first (and be seen below) or find the chain gone.
        if (await conn.execute(self._sql.lock_chain(chain_id))).first() is None:
            raise _chain_not_found(chain_id)
        if await conn.scalar(self._sql.blocked_dependents_exist(chain_id)):
            raise ChainInUseError(
                f"chain {chain_id} cannot be deleted: jobs of other chains are blocked on it; "
                "delete or cancel those chains first, or let this chain finish"
            )
        for statement in self._sql.delete_chain(chain_id):
            await conn.execute(statement)

    # -- reading -----------------------------------------------------------------------

    async def get_chain(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """The chain as stored; raises ``ChainNotFoundError``."""
        _check_key(chain_id, "chain_id")
        async with self._read(session) as conn:
            return await self._get_chain(conn, chain_id)

    async def get_chains(
        self, chain_ids: Sequence[str], *, session: CallerSession = None
    ) -> list[ChainRecord]:
        """The chains among ``chain_ids`` that exist, in the order given; unknown ids
        are left out. One read (per thousand ids)."""
        if isinstance(chain_ids, str):
            raise InvalidInputError("chain_ids must be a sequence of chain ids, not one string")
        wanted = [_check_key(chain_id, "a chain id") for chain_id in dict.fromkeys(chain_ids)]
        found: dict[str, ChainRecord] = {}
        async with self._read(session) as conn:
            for start in range(0, len(wanted), _IDS_PER_READ):
                batch = {"chain_ids": wanted[start : start + _IDS_PER_READ]}
                for row in (await conn.execute(self._sql.get_chains, batch)).mappings():
                    chain = chain_record(row)
                    found[chain.id] = chain
        return [found[chain_id] for chain_id in wanted if chain_id in found]

    async def _get_chain(self, conn: AsyncConnection, chain_id: str) -> ChainRecord:
        row = (await conn.execute(self._sql.get_chain, {"chain_id": chain_id})).mappings().first()
        if row is None:
            raise _chain_not_found(chain_id)
        return chain_record(row)

    async def get_job(self, job_id: str, *, session: CallerSession = None) -> JobRecord:
        """The job as stored; raises ``JobNotFoundError``."""
        _check_key(job_id, "job_id")
        async with self._read(session) as conn:
            row = (await conn.execute(self._sql.get_job, {"job_id": job_id})).mappings().first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return job_record(row)

    async def list_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Chains newest first (ids are time-ordered), keyset-paginated by id."""
        _check_status(status)
        _check_optional_key(type_name, "type_name")
        limit = _check_limit(limit)
        statement = self._sql.list_chains(status, type_name, limit + 1, _check_id_cursor(after))
        async with self._read(None) as conn:
            rows = (await conn.execute(statement)).mappings().all()
        items = [chain_record(row) for row in rows[:limit]]
        cursor = items[-1].id if len(rows) > limit else None
        return Page(items, cursor)

    async def list_jobs(
        self,
        *,
        chain_id: str | None = None,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Jobs newest first; with ``chain_id``, that chain's jobs in chain order."""
        _check_status(status)
        _check_optional_key(chain_id, "chain_id")
        _check_optional_key(type_name, "type_name")
        limit = _check_limit(limit)
        cursor = _check_index_cursor(after) if chain_id is not None else _check_id_cursor(after)
        statement = self._sql.list_jobs(chain_id, status, type_name, limit + 1, cursor)
        async with self._read(None) as conn:
            rows = (await conn.execute(statement)).mappings().all()
        items = [job_record(row) for row in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            next_cursor = str(last.chain_index) if chain_id is not None else last.id
        return Page(items, next_cursor)

    async def count_jobs(self, *, type_names: Sequence[str] | None = None) -> Mapping[str, int]:
        """Number of jobs per status (every status present, zero included)."""
        types = None if type_names is None else _check_type_names(type_names)
        counts: dict[str, int] = dict.fromkeys(ALL_STATUSES, 0)
        async with self._read(None) as conn:
            for status, count in await conn.execute(self._sql.count_jobs(types)):
                counts[status] = int(count)
        return counts

    # -- transactions ------------------------------------------------------------------

    async def _write(
        self,
        session: CallerSession,
        notes: NotificationBuffer,
        work: Callable[[AsyncConnection, NotificationBuffer], Awaitable[T]],
    ) -> T:
        """Run ``work`` in the caller's transaction, or in one of our own that is
        committed (and retried on a deadlock) before returning. ``notes`` gets
        the notifications only if the work succeeded."""
        if session is not None:
            staged = NotificationBuffer()
            result = await work(await _caller_connection(session), staged)
            notes.absorb(staged)
            return result
        attempt = 0
        while True:
            attempt += 1
            staged = NotificationBuffer()
            try:
                async with self.engine.begin() as conn:
                    result = await work(conn, staged)
            except DBAPIError as exc:
                if not dialects.is_retryable(exc) or attempt >= _MAX_TRANSACTION_RETRIES:
                    raise
                logger.info("transaction conflict; retrying", extra={"attempt": attempt})
                await asyncio.sleep(0.005 * attempt)
                continue
            notes.absorb(staged)
            return result

    @asynccontextmanager
    async def _read(self, session: CallerSession) -> Any:
        if session is not None:
            yield await _caller_connection(session)
            return
        async with self._reader.connect() as conn:
            yield conn


@asynccontextmanager
async def _begun(conn: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    async with conn.begin():
        yield conn


async def _caller_connection(
    session: AsyncSession | AsyncConnection | SyncConnection,
) -> AsyncConnection:
    if isinstance(session, AsyncSession):
        return await session.connection()
    if isinstance(session, AsyncConnection):
        return session
    if isinstance(session, SyncConnection):
        # Awaits on it finish at once (see state_adapters.sync_bridge).
        return cast(AsyncConnection, session)
    raise wrong_session(session)


# -- records -----------------------------------------------------------------------------

_JOB_WIDTH = len(JOB_FIELDS)


def _claimed(jobs: list[JobRecord]) -> list[JobRecord]:
    """Claimed jobs in claim order (a statement returns them in any order)."""
    jobs.sort(key=lambda j: (j.priority, j.scheduled_at, j.id))
    return jobs


def _note_final(
    finalized: list[tuple[str, bool]], chain_id: str | None, has_dependents: bool | None
) -> None:
    if chain_id is not None:
        finalized.append((chain_id, bool(has_dependents)))


def _claim_params(
    type_names: Sequence[str], worker_id: str, lease_seconds: float, limit: int, now: datetime
) -> dict[str, Any]:
    """The parameters of the claim statement (``limit`` 0 when there is nothing to claim);
    ``type_count`` and ``limit`` also choose its shape (:meth:`Statements.claim`)."""
    types = _check_type_names(type_names)
    _check_worker_id(worker_id)
    validation.check_seconds(lease_seconds, "lease_seconds", allow_zero=False)
    return {
        **{f"type_{i}": name for i, name in enumerate(types)},
        "type_count": len(types),
        "now": now,
        "limit": int(limit) if types and limit >= 1 else 0,
        "b_worker_id": worker_id,
        "b_leased_until": now + timedelta(seconds=lease_seconds),
    }


def _deduplicates(chain: NewChain, holder: Any, now: datetime) -> bool:
    """Whether the chain holding the key answers this start instead of a new chain."""
    if chain.dedup_scope == "incomplete" and holder.completed_at is not None:
        return False
    if chain.dedup_window is not None:
        created: datetime = holder.created_at
        return created >= now - timedelta(seconds=chain.dedup_window)
    return True


def _now() -> datetime:
    return datetime.now(UTC)


def _ownership_lost(job_id: str) -> JobOwnershipLostError:
    return JobOwnershipLostError(
        f"job {job_id}: the lease token is stale (lease expired and reaped, job cancelled, "
        "or completed elsewhere); nothing was written"
    )


def _chain_not_found(chain_id: str) -> ChainNotFoundError:
    return ChainNotFoundError(f"no chain with id {chain_id!r}")


# -- validation (before any write) -------------------------------------------------------


def _check_type_names(type_names: Sequence[str]) -> list[str]:
    if isinstance(type_names, str):
        raise InvalidInputError("type_names must be a sequence of type names, not one string")
    return [validation.check_type_name(name) for name in dict.fromkeys(type_names)]


def _check_distinct_ids(chains: Sequence[NewChain]) -> None:
    given = [chain.id for chain in chains if chain.id is not None]
    if len(set(given)) != len(given):
        raise InvalidInputError("two chains of one start_chains batch have the same id")


def _check_key(value: Any, what: str) -> str:
    """An id or name that selects rows: a string Postgres can compare (no NUL, no lone
    surrogate), refused here rather than by the driver halfway through a call."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {value!r}")
    return validation.check_text(value, what)


def _check_optional_key(value: Any, what: str) -> None:
    if value is not None:
        _check_key(value, what)


def _check_worker_id(worker_id: Any) -> None:
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > WORKER_ID_LENGTH:
        raise InvalidInputError(
            f"worker_id must be a non-empty string of at most {WORKER_ID_LENGTH} characters"
        )


def _check_status(status: Any) -> None:
    if status is not None and status not in ALL_STATUSES:
        raise InvalidInputError(f"status must be one of {ALL_STATUSES}, got {status!r}")


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return limit


def _check_id_cursor(after: Any) -> str | None:
    if after is None:
        return None
    if not validation.is_id(after):
        raise InvalidInputError(f"after must be a next_cursor from a previous page, got {after!r}")
    return str(after)


def _check_index_cursor(after: Any) -> str | None:
    if after is None:
        return None
    if not isinstance(after, str) or not after.isdigit():
        raise InvalidInputError(f"after must be a next_cursor from a previous page, got {after!r}")
    return after


if TYPE_CHECKING:  # mypy checks that the adapter has every capability the protocol declares
    _CONFORMS: type[StateAdapter] = SqlAlchemyStateAdapter
