"""The SQL of the queue's own path — starting chains, claiming, leases, failing,
reaping, chains becoming final — built with SQLAlchemy Core, named for what each
statement does, on any dialect (how a statement is shaped for one database is
asked of its :class:`~state_adapters.statements.dialect.SqlDialect`).

One calling convention: every statement is a method that takes the values and
returns a :class:`Query` (the statement and its parameters; a :class:`Batch` for
an insert of many rows), run as ``await conn.execute(*query)``. A statement
whose shape never changes is built once per table set and bound with
parameters, so it can also be compiled once
(:class:`~state_adapters.statements.compiled.CompiledStatement`). The application's reads
and chain actions are :mod:`state_adapters.statements.chains`'; the SQL only one
database has lives with that database (:mod:`state_adapters.postgres.statements`,
:mod:`state_adapters.sqlite.database`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Executable,
    Insert,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.model import JobRecord
from state_adapters.schema import Tables, UtcDateTime, json_type
from state_adapters.statements.claims import best_due
from state_adapters.statements.controlled_types import paused
from state_adapters.statements.dialect import SqlDialect

JOB_FIELDS = tuple(JobRecord.__dataclass_fields__)
LEASE_EXPIRED_ERROR = "lease expired: the worker stopped renewing it (crashed, killed or stalled)"
_JSON = json_type()


class Query(NamedTuple):
    """A statement and its parameters."""

    statement: Executable
    params: Mapping[str, Any]


class Batch(NamedTuple):
    """A statement run once per row (``executemany``)."""

    statement: Executable
    rows: Sequence[Mapping[str, Any]]


def job_columns(tables: Tables) -> list[ColumnElement[Any]]:
    """The job columns in the order of ``JobRecord``'s fields: a row of them is a
    ``JobRecord``'s arguments."""
    return [tables.jobs.c[name] for name in JOB_FIELDS]


class Statements:
    """The queue's statements on one table set, shaped by one dialect."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.job_columns = job_columns(tables)
        self._claims: dict[tuple[int, int], Update] = {}
        self._fails: dict[int, Update] = {}

    # -- starting chains ---------------------------------------------------------------

    def mark_dependents(self, chain_ids: Sequence[str]) -> Query:
        """Flag the given chains as having dependents, locking their rows in id order
        until this transaction ends; returns each chain's id and completion time.

        A chain that is not final yet cannot become final before this
        transaction ends, and the transaction that makes it final then sees the
        flag and this transaction's blocked jobs (see :meth:`finalize_chains`).
        """
        return Query(self._mark_dependents, {"chain_ids": sorted(chain_ids)})

    @cached_property
    def _mark_dependents(self) -> Update:
        chains = self.tables.chains
        locked = self.dialect.update_lock(
            select(chains.c.id)
            .where(self.dialect.in_list(chains.c.id, "chain_ids"))
            .order_by(chains.c.id)
        )
        return (
            update(chains)
            .where(chains.c.id.in_(locked.scalar_subquery()))
            .values(has_dependents=True)
            .returning(chains.c.id, chains.c.completed_at)
        )

    def insert_chains(self, first_job_rows: Sequence[Mapping[str, Any]]) -> Batch:
        """Insert the chain rows of new chains, made of their first jobs' rows."""
        rows = [
            {
                "id": row["chain_id"],
                "type_name": row["type_name"],
                "created_at": row["created_at"],
                "completed_at": None,
                "has_dependents": False,
                "dedup_key": row["deduplication_key"],
            }
            for row in first_job_rows
        ]
        return Batch(self._insert_chains, rows)

    @cached_property
    def _insert_chains(self) -> Insert:
        return insert(self.tables.chains)

    def insert_jobs(self, job_rows: Sequence[Mapping[str, Any]]) -> Batch:
        """Insert job rows (every column given)."""
        return Batch(self._insert_jobs, list(job_rows))

    @cached_property
    def _insert_jobs(self) -> Insert:
        return insert(self.tables.jobs)

    def insert_blockers(self, rows: Sequence[Mapping[str, str]]) -> Batch:
        """Record which chains blocked jobs wait for (``job_id``, ``blocker_chain_id``)."""
        return Batch(self._insert_blockers, list(rows))

    @cached_property
    def _insert_blockers(self) -> Insert:
        return insert(self.tables.blockers)

    def take_dedup_key(self, type_name: str, dedup_key: str, chain_id: str, now: datetime) -> Query:
        """Take a deduplication key unless another chain holds it (returns the row if taken)."""
        values = {"type_name": type_name, "dedup_key": dedup_key, "chain_id": chain_id}
        return Query(self._take_dedup_key, {**values, "created_at": now})

    @cached_property
    def _take_dedup_key(self) -> Insert:
        keys = self.tables.dedup_keys
        return self.dialect.insert_or_ignore(keys).returning(keys.c.chain_id)  # type: ignore[no-any-return]

    def read_dedup_key(self, type_name: str, dedup_key: str) -> Query:
        """The key's holder, when it took the key, and the holding chain's
        ``existing_id`` (null once deleted) and ``completed_at``."""
        return Query(self._read_dedup_key, {"b_type_name": type_name, "b_dedup_key": dedup_key})

    @cached_property
    def _read_dedup_key(self) -> Select[Any]:
        keys, chains = self.tables.dedup_keys, self.tables.chains
        return (
            select(
                keys.c.chain_id,
                keys.c.created_at,
                chains.c.id.label("existing_id"),
                chains.c.completed_at,
            )
            .select_from(keys.outerjoin(chains, chains.c.id == keys.c.chain_id))
            .where(
                keys.c.type_name == bindparam("b_type_name"),
                keys.c.dedup_key == bindparam("b_dedup_key"),
            )
        )

    def move_dedup_key(
        self, type_name: str, dedup_key: str, from_chain: str, to_chain: str, now: datetime
    ) -> Query:
        """Hand the key to a new chain only if ``from_chain`` still holds it
        (compare-and-swap: a concurrent taker makes this match nothing)."""
        params = {
            "b_type_name": type_name,
            "b_dedup_key": dedup_key,
            "b_from_chain": from_chain,
            "b_to_chain": to_chain,
            "b_now": now,
        }
        return Query(self._move_dedup_key, params)

    @cached_property
    def _move_dedup_key(self) -> Update:
        keys = self.tables.dedup_keys
        return (
            update(keys)
            .where(
                keys.c.type_name == bindparam("b_type_name"),
                keys.c.dedup_key == bindparam("b_dedup_key"),
                keys.c.chain_id == bindparam("b_from_chain"),
            )
            .values(
                chain_id=bindparam("b_to_chain"),
                created_at=bindparam("b_now", type_=keys.c.created_at.type),
            )
            .returning(keys.c.chain_id)
        )

    # -- acquisition and leases --------------------------------------------------------

    def claim(
        self,
        type_names: Sequence[str],
        *,
        worker_id: str,
        leased_until: datetime,
        limit: int,
        now: datetime,
    ) -> Query:
        """Mark the best eligible pending jobs of these types (up to ``limit``, at
        least one) running under a fresh lease, in one statement; the row locks
        (Postgres) or the write lock (SQLite) make every job go to one claimer.
        Returns the claimed jobs' rows (in any order)."""
        shape = (len(type_names), limit)
        statement = self._claims.get(shape)
        if statement is None:
            statement = self._claims[shape] = self._claim(*shape)
        params = {
            **{f"type_{i}": name for i, name in enumerate(type_names)},
            "now": now,
            "b_worker_id": worker_id,
            "b_leased_until": leased_until,
        }
        return Query(statement, params)

    def _claim(self, type_count: int, limit: int) -> Update:
        """The claim of ``type_count`` types and ``limit`` jobs.

        The limit and the statuses are written into the SQL, not bound: a worker
        sends a handful of these shapes, and Postgres can then plan each once (a
        generic plan of a bound status cannot use the index of pending jobs). Which
        jobs it takes: :func:`~state_adapters.statements.claims.best_due`."""
        jobs = self.tables.jobs
        best = best_due(self.tables, self.dialect, type_count, limit)
        pending: ColumnElement[str] = literal_column("'pending'")
        return (
            update(jobs)
            .where(self.dialect.id_in_selected(jobs.c.id, best))
            # Rechecked after the row lock (Postgres); the rows come by primary key.
            .where(self.dialect.without_index(jobs.c.status) == pending)
            # A claim lost with the server is redone: its commit need not wait for disk.
            .where(self.dialect.commit_without_flush())
            .values(
                status="running",
                attempt=jobs.c.attempt + 1,
                leased_by=bindparam("b_worker_id"),
                lease_token=self.dialect.random_token(),
                leased_until=bindparam("b_leased_until", type_=UtcDateTime()),
            )
            .returning(*self.job_columns)
        )

    def next_due_at(self, type_names: Sequence[str]) -> Query:
        """The earliest ``scheduled_at`` of a pending job of these types, leaving out
        paused types (read in the statement, so a stale view of the controls cannot
        hide a due job)."""
        return Query(self._next_due_at, {"type_names": list(type_names)})

    @cached_property
    def _next_due_at(self) -> Select[Any]:
        jobs = self.tables.jobs
        return select(func.min(jobs.c.scheduled_at)).where(
            jobs.c.status == "pending",
            jobs.c.type_name.in_(bindparam("type_names", expanding=True)),
            ~paused(self.tables),
        )

    def renew_lease(self, job_id: str, lease_token: str, leased_until: datetime) -> Query:
        """Extend a lease the token still holds; returns the new ``leased_until``."""
        params = {"job_id": job_id, "b_lease_token": lease_token, "b_leased_until": leased_until}
        return Query(self._renew_lease, params)

    @cached_property
    def _renew_lease(self) -> Update:
        jobs = self.tables.jobs
        return (
            update(jobs)
            .where(self._fenced)
            .values(leased_until=bindparam("b_leased_until", type_=UtcDateTime()))
            .returning(jobs.c.leased_until)
        )

    def set_progress(self, job_id: str, lease_token: str, progress: Any) -> Query:
        """Store a running job's progress if the token still holds its lease."""
        params = {"job_id": job_id, "b_lease_token": lease_token, "b_progress": progress}
        return Query(self._set_progress, params)

    @cached_property
    def _set_progress(self) -> Update:
        jobs = self.tables.jobs
        return (
            update(jobs)
            .where(self._fenced)
            .values(progress=bindparam("b_progress", type_=_JSON))
            .returning(jobs.c.id)
        )

    @cached_property
    def _fenced(self) -> ColumnElement[bool]:
        jobs = self.tables.jobs
        return and_(
            jobs.c.id == bindparam("job_id"),
            jobs.c.lease_token == bindparam("b_lease_token"),
            jobs.c.status == "running",
        )

    # -- failed attempts and expired leases --------------------------------------------

    def fail_leased(
        self,
        job_id: str,
        lease_token: str,
        error: str,
        *,
        delays: Sequence[float],
        now: datetime,
        final: bool = False,
    ) -> Query:
        """Record a failed attempt: back to pending after ``delays[attempt - 1]``
        seconds (the last delay for every later attempt), or failed for good when
        ``max_attempts`` is used up or the failure is ``final``. Fenced by the lease
        token; returns the job's new status, ``scheduled_at``, chain and type.

        Of fixed shape for a number of delays, everything else bound (the retry
        instants too), so it is compiled once per count: an adapter sends two counts,
        its backoff's and the one of a ``retry_delay``."""
        params: dict[str, Any] = {
            "job_id": job_id,
            "b_lease_token": lease_token,
            "b_error": error,
            "b_final": final,
            "now": now,
        }
        for attempt, delay in enumerate(delays, start=1):
            params[f"b_retry_{attempt}"] = now + timedelta(seconds=delay)
        return Query(self._fail_leased(len(delays)), params)

    def _fail_leased(self, delay_count: int) -> Update:
        statement = self._fails.get(delay_count)
        if statement is not None:
            return statement
        jobs = self.tables.jobs
        exhausted = or_(
            bindparam("b_final", type_=Boolean()),
            and_(jobs.c.max_attempts.is_not(None), jobs.c.attempt >= jobs.c.max_attempts),
        )
        instants = [
            bindparam(f"b_retry_{attempt}", type_=UtcDateTime())
            for attempt in range(1, delay_count + 1)
        ]
        retry_at: ColumnElement[Any] = instants[-1]
        if delay_count > 1:
            retry_at = case(
                {attempt: instant for attempt, instant in enumerate(instants[:-1], start=1)},
                value=jobs.c.attempt,
                else_=instants[-1],
            )
        error = bindparam("b_error", type_=String())
        statement = (
            update(jobs)
            .where(self._fenced)
            .values(**self._after_attempt(exhausted, retry_at, error))
            .returning(jobs.c.status, jobs.c.scheduled_at, jobs.c.chain_id, jobs.c.type_name)
        )
        self._fails[delay_count] = statement
        return statement

    def _after_attempt(
        self, exhausted: ColumnElement[bool], retry_at: ColumnElement[Any], error: Any
    ) -> dict[str, Any]:
        jobs = self.tables.jobs
        now = bindparam("now", type_=UtcDateTime())
        return {
            "status": case((exhausted, literal("failed")), else_=literal("pending")),
            "scheduled_at": case((exhausted, jobs.c.scheduled_at), else_=retry_at),
            "completed_at": case((exhausted, now), else_=null()),
            "last_error": error,
            "leased_until": None,
        }

    def reap_expired(self, type_names: Sequence[str] | None, limit: int, now: datetime) -> Query:
        """Return running jobs whose lease expired to pending (or failed when attempts
        are used up); each row goes to one reaper only. Expired means before the
        database's clock (:meth:`SqlDialect.clock`; ``now`` on SQLite), so a reaper
        whose clock runs ahead cannot take live jobs."""
        params: dict[str, Any] = {"limit": limit, "now": now}
        if type_names is None:
            return Query(self._reap_any_type, params)
        return Query(self._reap_types, {**params, "type_names": list(type_names)})

    @cached_property
    def _reap_any_type(self) -> Update:
        return self._reap(by_type=False)

    @cached_property
    def _reap_types(self) -> Update:
        return self._reap(by_type=True)

    def _reap(self, *, by_type: bool) -> Update:
        jobs = self.tables.jobs
        now = self.dialect.clock(bindparam("now", type_=UtcDateTime()))
        expired = and_(jobs.c.status == "running", jobs.c.leased_until < now)
        candidates = select(jobs.c.id).where(expired)
        if by_type:
            candidates = candidates.where(
                jobs.c.type_name.in_(bindparam("type_names", expanding=True))
            )
        candidates = candidates.order_by(jobs.c.leased_until).limit(bindparam("limit"))
        candidates = self.dialect.skip_locked(candidates)
        exhausted = and_(jobs.c.max_attempts.is_not(None), jobs.c.attempt >= jobs.c.max_attempts)
        return (
            update(jobs)
            .where(self.dialect.id_in_selected(jobs.c.id, candidates), expired)
            # A reaped job keeps its place in the queue (its scheduled_at): with a
            # backlog, a dead worker's jobs run next rather than after the backlog.
            .values(**self._after_attempt(exhausted, jobs.c.scheduled_at, LEASE_EXPIRED_ERROR))
            .returning(jobs.c.id, jobs.c.status, jobs.c.chain_id, jobs.c.type_name)
        )

    # -- chains becoming final ---------------------------------------------------------

    def finalize_chains(self, chain_ids: Sequence[str], now: datetime) -> Query:
        """Mark chains final once; returns the id and ``has_dependents`` of each
        chain that was not final before.

        The chain rows are locked in id order first. A transaction blocking a job
        on one of them (:meth:`mark_dependents`) either commits before this and
        its flag and job are seen here and by :meth:`unblock_dependents` (a later
        statement), or runs after and sees the chain final.
        """
        return Query(self._finalize_chains, {"chain_ids": sorted(chain_ids), "now": now})

    @cached_property
    def _finalize_chains(self) -> Update:
        chains = self.tables.chains
        open_chains = and_(
            self.dialect.in_list(chains.c.id, "chain_ids"),
            chains.c.completed_at.is_(None),
        )
        locked = self.dialect.update_lock(
            select(chains.c.id).where(open_chains).order_by(chains.c.id)
        )
        return (
            update(chains)
            .where(chains.c.id.in_(locked.scalar_subquery()), chains.c.completed_at.is_(None))
            .values(completed_at=bindparam("now", type_=UtcDateTime()))
            .returning(chains.c.id, chains.c.has_dependents)
        )

    def unblock_dependents(self, final_chain_ids: Sequence[str]) -> Query:
        """Count the newly final chains off every job blocked on them; a job whose
        count reaches zero becomes pending. Row-level arithmetic, so two
        transactions finishing two blockers of one job both count."""
        return Query(self._unblock_dependents, {"final_ids": list(final_chain_ids)})

    @cached_property
    def _unblock_dependents(self) -> Update:
        jobs, blockers = self.tables.jobs, self.tables.blockers
        final = self.dialect.in_list(blockers.c.blocker_chain_id, "final_ids")
        resolved = (
            select(func.count())
            .select_from(blockers)
            .where(blockers.c.job_id == jobs.c.id, final)
            .scalar_subquery()
        )
        remaining = jobs.c.blockers_pending - resolved
        waiting = select(blockers.c.job_id).where(final)
        return (
            update(jobs)
            .where(jobs.c.status == "blocked", jobs.c.id.in_(waiting.scalar_subquery()))
            .values(
                blockers_pending=remaining,
                status=case((remaining <= 0, literal("pending")), else_=jobs.c.status),
            )
            .returning(jobs.c.id, jobs.c.status, jobs.c.type_name)
        )
