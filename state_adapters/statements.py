"""Every SQL statement of the state adapter, built with SQLAlchemy Core and named
for what it does. Statements whose shape never changes are built once per
adapter (with bind parameters); the others are built per call from a few
values. Dialect differences come from :mod:`state_adapters.dialects`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Delete,
    Insert,
    Integer,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.types import TypeEngine

from state_adapters import dialects
from state_adapters.protocol import UNFINISHED_STATUSES, JobRecord
from state_adapters.schema import Tables, UtcDateTime, json_type
from state_adapters.sql_dialect import SqlDialect

JOB_FIELDS = tuple(JobRecord.__dataclass_fields__)
_JSON = json_type()
_JSONB = JSONB()


def _json_records(parameter: str, **columns: TypeEngine[Any]) -> TableValuedAlias:
    """Postgres: the rows of a JSON array bound as one parameter
    (``jsonb_to_recordset``), with typed columns."""
    return (
        func.jsonb_to_recordset(bindparam(parameter, type_=_JSONB))
        .table_valued(*(column(name, type_) for name, type_ in columns.items()))
        .render_derived(with_types=True)
    )


LEASE_EXPIRED_ERROR = "lease expired: the worker stopped renewing it (crashed, killed or stalled)"


class Statements:
    """The statements of one table set on one dialect."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.postgres = dialect.name == "postgresql"
        jobs, chains = tables.jobs, tables.chains
        # In the order of JobRecord's fields: a row of them is a JobRecord's arguments.
        self.job_columns = [jobs.c[name] for name in JOB_FIELDS]
        self.chain_columns = [
            chains.c.type_name.label("chain_type_name"),
            chains.c.created_at.label("chain_created_at"),
            chains.c.completed_at.label("chain_completed_at"),
        ]
        fenced = and_(
            jobs.c.id == bindparam("job_id"),
            jobs.c.lease_token == bindparam("b_lease_token"),
            jobs.c.status == "running",
        )
        self.renew_lease = (
            update(jobs)
            .where(fenced)
            .values(leased_until=bindparam("b_leased_until", type_=UtcDateTime()))
            .returning(jobs.c.leased_until)
        )
        self.set_progress = (
            update(jobs)
            .where(fenced)
            .values(progress=bindparam("b_progress", type_=_JSON))
            .returning(jobs.c.id)
        )
        self.next_due_at = select(func.min(jobs.c.scheduled_at)).where(
            jobs.c.status == "pending",
            jobs.c.type_name.in_(bindparam("type_names", expanding=True)),
        )
        self.get_chain = self._chain_select().where(chains.c.id == bindparam("chain_id"))
        self.get_chains = self._chain_select().where(
            chains.c.id.in_(bindparam("chain_ids", expanding=True))
        )
        self.get_job = select(*self.job_columns).where(jobs.c.id == bindparam("job_id"))
        self._claims: dict[tuple[int, int], Update] = {}

    # -- starting chains ---------------------------------------------------------------

    def mark_dependents(self, chain_ids: Sequence[str]) -> tuple[Update, dict[str, Any]]:
        """Flag the given chains as having dependents, locking their rows in id order
        until this transaction ends; returns each chain's id and completion time.

        A chain that is not final yet cannot become final before this
        transaction ends, and the transaction that makes it final then sees the
        flag and this transaction's blocked jobs (see :meth:`finalize_chains`).
        """
        return self._mark_dependents, {"chain_ids": sorted(chain_ids)}

    @cached_property
    def _mark_dependents(self) -> Update:
        chains = self.tables.chains
        locked = self.dialect.update_lock(
            select(chains.c.id)
            .where(chains.c.id.in_(bindparam("chain_ids", expanding=True)))
            .order_by(chains.c.id)
        )
        return (
            update(chains)
            .where(chains.c.id.in_(locked.scalar_subquery()))
            .values(has_dependents=True)
            .returning(chains.c.id, chains.c.completed_at)
        )

    @cached_property
    def insert_jobs(self) -> Insert:
        """Insert job rows (every column given)."""
        return insert(self.tables.jobs)

    @cached_property
    def insert_chains(self) -> Insert:
        """Insert chain rows (every column given)."""
        return insert(self.tables.chains)

    def insert_chains_and_jobs(
        self, job_rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[Any, Any]]:
        """(statement, parameters) pairs that insert new chains and their first jobs,
        given the first jobs' rows (a chain row is made of its first job's).

        Postgres: one statement of fixed shape fed with one JSON document (the
        chains insert is a CTE), so a start outside a caller's transaction is one
        round trip whatever the batch size. SQLite: two executemany inserts.
        """
        if not self.postgres:
            chain_rows = [
                {
                    "id": row["chain_id"],
                    "type_name": row["type_name"],
                    "created_at": row["created_at"],
                    "completed_at": None,
                    "has_dependents": False,
                    "dedup_key": row["deduplication_key"],
                }
                for row in job_rows
            ]
            return [(self.insert_chains, chain_rows), (self.insert_jobs, list(job_rows))]
        batch = [
            {
                "id": row["id"],
                "type_name": row["type_name"],
                "input": row["input"],
                "status": row["status"],
                "priority": row["priority"],
                "scheduled_at": row["scheduled_at"].isoformat(),
                "max_attempts": row["max_attempts"],
                "dedup_key": row["deduplication_key"],
                "blockers_pending": row["blockers_pending"],
            }
            for row in job_rows
        ]
        return [(self.insert_first_jobs, {"batch": batch, "now": job_rows[0]["created_at"]})]

    @cached_property
    def insert_first_jobs(self) -> Any:
        """Postgres: ``WITH new_chains AS (INSERT INTO chains SELECT ... FROM rows)
        INSERT INTO jobs SELECT ... FROM rows``, the rows being one JSON document
        (one parameter, encoded in one call, inputs embedded as they are)."""
        t = self.tables
        now = bindparam("now", type_=UtcDateTime())
        rows = _json_records(
            "batch",
            id=String(),
            type_name=String(),
            input=_JSONB,
            status=String(),
            priority=Integer(),
            scheduled_at=DateTime(timezone=True),
            max_attempts=Integer(),
            dedup_key=String(),
            blockers_pending=Integer(),
        )
        new_chains = (
            insert(t.chains)
            .from_select(
                ["id", "type_name", "created_at", "completed_at", "has_dependents", "dedup_key"],
                select(rows.c.id, rows.c.type_name, now, null(), false(), rows.c.dedup_key),
            )
            .cte("new_chains")
        )
        job_values = {
            "id": rows.c.id,
            "chain_id": rows.c.id,
            "chain_index": literal(0),
            "type_name": rows.c.type_name,
            "input": rows.c.input,
            "status": rows.c.status,
            "priority": rows.c.priority,
            "created_at": now,
            "scheduled_at": rows.c.scheduled_at,
            "attempt": literal(0),
            "max_attempts": rows.c.max_attempts,
            "deduplication_key": rows.c.dedup_key,
            "blockers_pending": rows.c.blockers_pending,
        }
        return (
            insert(t.jobs)
            .from_select(list(job_values), select(*job_values.values()))
            .add_cte(new_chains)
        )

    def insert_dedup_key(self) -> Any:
        """Take a deduplication key unless another chain holds it (returns the row if taken)."""
        keys = self.tables.dedup_keys
        return self.dialect.insert_or_ignore(keys).returning(keys.c.chain_id)

    def read_dedup_key(self, type_name: str, dedup_key: str) -> Select[Any]:
        keys, chains = self.tables.dedup_keys, self.tables.chains
        return (
            select(
                keys.c.chain_id,
                keys.c.created_at,
                chains.c.id.label("existing_id"),
                chains.c.completed_at,
            )
            .select_from(keys.outerjoin(chains, chains.c.id == keys.c.chain_id))
            .where(keys.c.type_name == type_name, keys.c.dedup_key == dedup_key)
        )

    def move_dedup_key(
        self, type_name: str, dedup_key: str, from_chain: str, to_chain: str, now: datetime
    ) -> Update:
        """Hand the key to a new chain only if ``from_chain`` still holds it
        (compare-and-swap: a concurrent taker makes this match nothing)."""
        keys = self.tables.dedup_keys
        return (
            update(keys)
            .where(
                keys.c.type_name == type_name,
                keys.c.dedup_key == dedup_key,
                keys.c.chain_id == from_chain,
            )
            .values(chain_id=to_chain, created_at=now)
            .returning(keys.c.chain_id)
        )

    # -- acquisition and leases --------------------------------------------------------

    def claim(self, type_count: int, limit: int) -> Update:
        """The claim statement of this shape, built once (see :meth:`_claim`)."""
        shape = (type_count, limit)
        statement = self._claims.get(shape)
        if statement is None:
            statement = self._claims[shape] = self._claim(type_count, limit)
        return statement

    def _claim(self, type_count: int, limit: int) -> Update:
        """Mark the best eligible pending jobs (up to ``limit``) running under a fresh
        lease, in one statement; the row locks (Postgres) or the write lock (SQLite)
        make every job go to one claimer. Parameters: ``type_0`` to
        ``type_{type_count - 1}`` (the worker's type names), ``now``, ``b_worker_id``,
        ``b_leased_until``.

        The limit and the statuses are written into the SQL, not bound: a worker
        sends a handful of these shapes, and Postgres can then plan each once (a
        generic plan of a bound status cannot use the index of pending jobs)."""
        jobs = self.tables.jobs
        pending: ColumnElement[str] = literal_column("'pending'")
        best = (
            select(jobs.c.id)
            .where(
                jobs.c.status == pending,
                jobs.c.type_name.in_([bindparam(f"type_{i}") for i in range(type_count)]),
                # Read off the acquire index in claim order, never sorted from another.
                self.dialect.without_index(jobs.c.scheduled_at)
                <= bindparam("now", type_=UtcDateTime()),
            )
            .order_by(jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
            .limit(literal_column(str(int(limit))))
        )
        best = self.dialect.claim_lock(best)
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

    def complete_leased(
        self, completions: Sequence[tuple[str, str, Any]], now: datetime, *, records: bool
    ) -> tuple[Update, dict[str, Any]]:
        """SQLite: complete each job whose lease token still matches, in one statement
        of fixed shape fed with one JSON document (so it compiles once, whatever the
        batch size); returns the completed rows, whole with ``records`` or else
        ``id``, ``chain_id`` and ``chain_index``. (Postgres uses
        :meth:`complete_in_one_statement`.)

        ``completions``: (job id, lease token, output); outputs are embedded as JSON
        text and stored as they are.
        """
        batch = [
            {"id": job_id, "token": token, "output": json.dumps(output)}
            for job_id, token, output in completions
        ]
        statement = self._complete_leased if records else self._complete_leased_ids
        return statement, {"batch": json.dumps(batch), "now": now}

    @cached_property
    def _complete_leased(self) -> Update:
        return self._complete_leased_rows.returning(*self.job_columns)

    @cached_property
    def _complete_leased_ids(self) -> Update:
        jobs = self.tables.jobs
        return self._complete_leased_rows.returning(jobs.c.id, jobs.c.chain_id, jobs.c.chain_index)

    @cached_property
    def _complete_leased_rows(self) -> Update:
        jobs = self.tables.jobs
        given = func.json_each(bindparam("batch", type_=String())).table_valued(
            "value", name="given"
        )

        def field(name: str) -> ColumnElement[Any]:
            return func.json_extract(given.c.value, literal_column(f"'$.{name}'"))

        return (
            update(jobs)
            .where(
                jobs.c.id == field("id"),
                jobs.c.lease_token == field("token"),
                # By primary key from the document, not by scanning running jobs.
                self.dialect.without_index(jobs.c.status) == "running",
            )
            .values(
                status="completed",
                output=field("output"),
                completed_at=bindparam("now", type_=UtcDateTime()),
                leased_until=None,
            )
        )

    def complete_in_one_statement(
        self,
        completions: Sequence[tuple[str, str, Any, bool]],
        next_jobs: Sequence[Mapping[str, Any]],
        now: datetime,
        *,
        alone: bool,
    ) -> tuple[Any, dict[str, Any]]:
        """Postgres: complete leased jobs, create the next jobs of continued chains
        and make finished chains final, in one statement of fixed shape.

        ``completions``: (job id, lease token, output, finishes the chain);
        ``next_jobs``: rows with ``previous_id``, created only if that job completed.
        Rows: every completed job, plus ``finalized_id`` and ``has_dependents`` for
        the chains it made final. A chain row that another transaction holds is
        waited for and then read as committed, so ``has_dependents`` is current.

        ``alone``: the statement is its own transaction (autocommit, one round
        trip). Unblocking the dependents of a chain needs a later statement of the
        same transaction (it must see the jobs blocked while the chain row was
        waited for), so then a chain with dependents makes the statement fail with
        :data:`dialects.NEEDS_TRANSACTION` in the error, and nothing is written: run it again
        in a transaction.
        """
        done = [
            {"id": job_id, "token": token, "output": output, "finishes": finishes}
            for job_id, token, output, finishes in completions
        ]
        follow = [
            {
                "previous_id": row["previous_id"],
                "id": row["id"],
                "type_name": row["type_name"],
                "input": row["input"],
                "priority": row["priority"],
                "scheduled_at": row["scheduled_at"].isoformat(),
                "max_attempts": row["max_attempts"],
            }
            for row in next_jobs
        ]
        ids = [row["id"] for row in done]
        params = {"done": done, "ids": ids, "follow": follow, "now": now, "alone": alone}
        return self._complete_in_one_statement, params

    @cached_property
    def _complete_in_one_statement(self) -> Any:
        done, continued, final = self._completion_ctes(records=True)
        return (
            select(*(done.c[c.name] for c in self.job_columns), *self._finalization_columns(final))
            .select_from(done.outerjoin(final, final.c.id == done.c.chain_id))
            .add_cte(continued)
        )

    @cached_property
    def complete_ids_statement(self) -> Any:
        """:meth:`complete_in_one_statement`'s statement for a caller that only needs to
        know which completions held (same parameters): rows of the completed job's
        ``id`` (its other columns null, so the row has the same places) and
        ``finalized_id``, ``has_dependents``."""
        done, continued, final = self._completion_ctes(records=False)
        return (
            select(
                done.c.id,
                *(null() for _ in self.job_columns[1:]),
                *self._finalization_columns(final),
            )
            .select_from(done.outerjoin(final, final.c.id == done.c.chain_id))
            .add_cte(continued)
        )

    def _finalization_columns(self, final: Any) -> list[ColumnElement[Any]]:
        """The chain a completion made final, whether jobs wait on it, and the refusal
        of a one-statement completion that must run in a transaction (see
        :meth:`complete_in_one_statement`)."""
        return [
            final.c.id.label("finalized_id"),
            final.c.has_dependents,
            # An error raised from SQL rolls the whole statement back.
            cast(
                case(
                    (
                        and_(bindparam("alone", type_=Boolean()), final.c.has_dependents),
                        literal(dialects.NEEDS_TRANSACTION),
                    ),
                    else_=null(),
                ),
                Integer(),
            ).label("refused"),
        ]

    def _completion_ctes(self, *, records: bool) -> tuple[Any, Any, Any]:
        """Postgres: the CTEs that complete the jobs (``done``, returning whole rows
        with ``records`` or else what the other CTEs need), create continuations
        (``continued``) and make finished chains final (``final``)."""
        t = self.tables
        jobs, chains = t.jobs, t.chains
        now = bindparam("now", type_=UtcDateTime())
        given = _json_records(
            "done", id=String(), token=String(), output=_JSONB, finishes=Boolean()
        )
        returned = self.job_columns if records else [jobs.c.id, jobs.c.chain_id, jobs.c.chain_index]
        done = (
            update(jobs)
            .where(
                # The ids again as an array: a generic plan estimates a JSON recordset at
                # 100 rows and, below some 20,000 jobs, would scan the table to join it.
                jobs.c.id == func.any(bindparam("ids", type_=ARRAY(String()))),
                jobs.c.id == given.c.id,
                jobs.c.lease_token == given.c.token,
                dialects.status_by_key(jobs.c.status) == "running",
            )
            .values(status="completed", output=given.c.output, completed_at=now, leased_until=None)
            .returning(*returned, given.c.finishes)
            .cte("done")
        )
        follow = _json_records(
            "follow",
            previous_id=String(),
            id=String(),
            type_name=String(),
            input=_JSONB,
            priority=Integer(),
            scheduled_at=DateTime(timezone=True),
            max_attempts=Integer(),
        )
        next_values = {
            "id": follow.c.id,
            "chain_id": done.c.chain_id,
            "chain_index": done.c.chain_index + 1,
            "type_name": follow.c.type_name,
            "input": follow.c.input,
            "status": literal("pending"),
            "priority": follow.c.priority,
            "created_at": now,
            "scheduled_at": follow.c.scheduled_at,
            "attempt": literal(0),
            "max_attempts": follow.c.max_attempts,
            "blockers_pending": literal(0),
        }
        continued = (
            insert(jobs)
            .from_select(
                list(next_values),
                select(*next_values.values()).select_from(
                    follow.join(done, done.c.id == follow.c.previous_id)
                ),
            )
            .cte("continued")
        )
        finishing = select(done.c.chain_id).where(done.c.finishes)
        locked = (
            select(chains.c.id)
            .where(chains.c.id.in_(finishing.scalar_subquery()), chains.c.completed_at.is_(None))
            .order_by(chains.c.id)
            .with_for_update()
        )
        final = (
            update(chains)
            .where(chains.c.id.in_(locked.scalar_subquery()), chains.c.completed_at.is_(None))
            .values(completed_at=now)
            .returning(chains.c.id, chains.c.has_dependents)
            .cte("final")
        )
        return done, continued, final

    def fail_leased(
        self,
        job_id: str,
        lease_token: str,
        error: str,
        retry_at: ColumnElement[Any],
        *,
        final: bool = False,
    ) -> Update:
        """Record a failed attempt: back to pending at ``retry_at``, or failed for
        good when ``max_attempts`` is used up or the failure is ``final``. Fenced by
        the lease token."""
        jobs = self.tables.jobs
        exhausted: ColumnElement[bool] = and_(
            jobs.c.max_attempts.is_not(None), jobs.c.attempt >= jobs.c.max_attempts
        )
        if final:
            exhausted = true()
        return (
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.lease_token == lease_token,
                jobs.c.status == "running",
            )
            .values(**self._after_attempt(exhausted, retry_at, error))
            .returning(jobs.c.status, jobs.c.scheduled_at, jobs.c.chain_id, jobs.c.type_name)
        )

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

    def retry_at(self, delays: Sequence[float], now: datetime) -> ColumnElement[Any]:
        """When attempt n's retry is due: ``now + delays[n - 1]`` (the last delay
        for every later attempt), as one SQL expression of the row's attempt."""
        from datetime import timedelta

        jobs = self.tables.jobs
        instants = [type_coerce(now + timedelta(seconds=d), UtcDateTime()) for d in delays]
        if len(instants) == 1:
            return instants[0]
        return case(
            {attempt: instant for attempt, instant in enumerate(instants[:-1], start=1)},
            value=jobs.c.attempt,
            else_=instants[-1],
        )

    def reap_expired(
        self, type_names: Sequence[str] | None, limit: int, now: datetime
    ) -> tuple[Update, dict[str, Any]]:
        """Return running jobs whose lease expired before ``now`` to pending (or
        failed when attempts are used up); each row goes to one reaper only."""
        params: dict[str, Any] = {"limit": limit, "now": now}
        if type_names is None:
            return self._reap_any_type, params
        return self._reap_types, {**params, "type_names": list(type_names)}

    @cached_property
    def _reap_any_type(self) -> Update:
        return self._reap(by_type=False)

    @cached_property
    def _reap_types(self) -> Update:
        return self._reap(by_type=True)

    def _reap(self, *, by_type: bool) -> Update:
        jobs = self.tables.jobs
        now = bindparam("now", type_=UtcDateTime())
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

    def finalize_chains(
        self, chain_ids: Sequence[str], now: datetime
    ) -> tuple[Update, dict[str, Any]]:
        """Mark chains final once; returns the id and ``has_dependents`` of each
        chain that was not final before.

        The chain rows are locked in id order first. A transaction blocking a job
        on one of them (:meth:`mark_dependents`) either commits before this and
        its flag and job are seen here and by :meth:`unblock_dependents` (a later
        statement), or runs after and sees the chain final.
        """
        return self._finalize_chains, {"chain_ids": sorted(chain_ids), "now": now}

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

    def unblock_dependents(self, final_chain_ids: Sequence[str]) -> tuple[Update, dict[str, Any]]:
        """Count the newly final chains off every job blocked on them; a job whose
        count reaches zero becomes pending. Row-level arithmetic, so two
        transactions finishing two blockers of one job both count."""
        return self._unblock_dependents, {"final_ids": list(final_chain_ids)}

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

    # -- application-side chain actions ------------------------------------------------

    def lock_unfinished_jobs(self, chain_id: str) -> Select[Any]:
        jobs = self.tables.jobs
        query = select(jobs.c.id, jobs.c.status, jobs.c.type_name).where(
            jobs.c.chain_id == chain_id, jobs.c.status.in_(UNFINISHED_STATUSES)
        )
        return self.dialect.update_lock(query)

    def finish_jobs(
        self, job_ids: Sequence[str], status: str, now: datetime, output: Any = None
    ) -> Update:
        """Move unfinished jobs to a final status without a lease (cancel,
        workerless completion)."""
        jobs = self.tables.jobs
        values: dict[str, Any] = {"status": status, "completed_at": now, "leased_until": None}
        if status == "completed":
            values["output"] = type_coerce(output, _JSON)
        return (
            update(jobs)
            .where(jobs.c.id.in_(list(job_ids)), jobs.c.status.in_(UNFINISHED_STATUSES))
            .values(**values)
        )

    def trigger_pending(self, chain_id: str, now: datetime) -> Update:
        jobs = self.tables.jobs
        return (
            update(jobs)
            .where(jobs.c.chain_id == chain_id, jobs.c.status == "pending")
            .values(scheduled_at=now)
            .returning(jobs.c.type_name)
        )

    def last_job(self, chain_id: str) -> Select[Any]:
        """The chain's last job (locked): the one a retry runs again."""
        jobs = self.tables.jobs
        query = (
            select(jobs.c.id, jobs.c.status, jobs.c.type_name)
            .where(jobs.c.chain_id == chain_id)
            .order_by(jobs.c.chain_index.desc())
            .limit(1)
        )
        return self.dialect.update_lock(query)

    def unfinished_blockers(self, job_id: str) -> Select[Any]:
        """The chains ``job_id`` waits on that are not final yet, share-locked so none
        becomes final (and releases its dependents) before this transaction commits."""
        blockers, chains = self.tables.blockers, self.tables.chains
        query = (
            select(chains.c.id)
            .join(blockers, blockers.c.blocker_chain_id == chains.c.id)
            .where(blockers.c.job_id == job_id, chains.c.completed_at.is_(None))
            .order_by(chains.c.id)
        )
        return self.dialect.share_lock(query)

    def retry_job(self, job_id: str, blockers_pending: int, now: datetime) -> Update:
        """Put a failed or cancelled job back as new: attempts start over, due now (or
        blocked while ``blockers_pending`` chains it waits on are unfinished)."""
        jobs = self.tables.jobs
        return (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_(("failed", "cancelled")))
            .values(
                status="blocked" if blockers_pending else "pending",
                blockers_pending=blockers_pending,
                attempt=0,
                scheduled_at=now,
                completed_at=None,
                leased_by=None,
                leased_until=None,
                lease_token=None,
            )
        )

    def reopen_chain(self, chain_id: str) -> Update:
        chains = self.tables.chains
        return update(chains).where(chains.c.id == chain_id).values(completed_at=None)

    def lock_chain(self, chain_id: str) -> Select[Any]:
        chains = self.tables.chains
        return self.dialect.update_lock(select(chains.c.id).where(chains.c.id == chain_id))

    def blocked_dependents_exist(self, chain_id: str) -> Select[Any]:
        jobs, blockers = self.tables.jobs, self.tables.blockers
        return select(
            exists().where(
                blockers.c.blocker_chain_id == chain_id,
                blockers.c.job_id == jobs.c.id,
                jobs.c.status == "blocked",
                jobs.c.chain_id != chain_id,
            )
        )

    def delete_chain(self, chain_id: str) -> list[Delete]:
        """Delete a chain, its jobs, their blocker links and its dedup key, in that order."""
        t = self.tables
        own_jobs = select(t.jobs.c.id).where(t.jobs.c.chain_id == chain_id).scalar_subquery()
        return [
            delete(t.blockers).where(
                or_(t.blockers.c.job_id.in_(own_jobs), t.blockers.c.blocker_chain_id == chain_id)
            ),
            delete(t.dedup_keys).where(t.dedup_keys.c.chain_id == chain_id),
            delete(t.jobs).where(t.jobs.c.chain_id == chain_id),
            delete(t.chains).where(t.chains.c.id == chain_id),
        ]

    # -- reading -----------------------------------------------------------------------

    def _chain_select(self) -> Select[Any]:
        """Chains joined with their last job (the highest ``chain_index``)."""
        chains, jobs = self.tables.chains, self.tables.jobs
        later = jobs.alias("later")
        last_index = (
            select(func.max(later.c.chain_index))
            .where(later.c.chain_id == chains.c.id)
            .scalar_subquery()
        )
        return select(*self.chain_columns, *self.job_columns).select_from(
            chains.join(
                jobs, and_(jobs.c.chain_id == chains.c.id, jobs.c.chain_index == last_index)
            )
        )

    def list_chains(
        self, status: str | None, type_name: str | None, limit: int, after: str | None
    ) -> Select[Any]:
        chains, jobs = self.tables.chains, self.tables.jobs
        query = self._chain_select()
        if status is not None:
            query = query.where(jobs.c.status == status)
        if type_name is not None:
            query = query.where(chains.c.type_name == type_name)
        if after is not None:
            query = query.where(chains.c.id < after)
        return query.order_by(chains.c.id.desc()).limit(limit)

    def list_jobs(
        self,
        chain_id: str | None,
        status: str | None,
        type_name: str | None,
        limit: int,
        after: str | None,
    ) -> Select[Any]:
        jobs = self.tables.jobs
        query = select(*self.job_columns)
        if status is not None:
            query = query.where(jobs.c.status == status)
        if type_name is not None:
            query = query.where(jobs.c.type_name == type_name)
        if chain_id is not None:
            query = query.where(jobs.c.chain_id == chain_id)
            if after is not None:
                query = query.where(jobs.c.chain_index > int(after))
            return query.order_by(jobs.c.chain_index).limit(limit)
        if after is not None:
            query = query.where(jobs.c.id < after)
        return query.order_by(jobs.c.id.desc()).limit(limit)

    def count_jobs(self, type_names: Sequence[str] | None) -> Select[Any]:
        jobs = self.tables.jobs
        query = select(jobs.c.status, func.count()).group_by(jobs.c.status)
        if type_names is not None:
            query = query.where(jobs.c.type_name.in_(list(type_names)))
        return query
