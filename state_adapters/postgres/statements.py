"""The SQL only Postgres has: the one-statement start of new chains and the
one-statement completion, each fed with JSON documents of one array per job
(``jsonb_array_elements``) so it has one shape whatever the batch size, is planned
once, and is one round trip when it runs alone. What is the same for every job (the
time) is bound once, not sent in each array. Same calling convention as
:mod:`state_adapters.statements.queue`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    column,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Subquery, TextualSelect
from sqlalchemy.types import TypeEngine

from state_adapters.schema import Tables, UtcDateTime
from state_adapters.statements.limited_claims import UNKEYED_WINDOW
from state_adapters.statements.queue import Query, job_columns
from state_adapters.statements.records import FirstJob, due_at, new_job_status
from state_adapters.steps.completion import FinishedJob
from state_adapters.steps.limited_claims import MAX_KEYS_VISITED, RATE_STEPS

NEEDS_TRANSACTION = "queuert: a finished chain has dependents; complete it in a transaction"
"""Raised from SQL (as invalid integer text) by a one-statement completion that must
run in a transaction instead; the statement then wrote nothing."""

_JSONB = JSONB()
_POSTGRES = postgresql.dialect()  # type: ignore[no-untyped-call]


def _json_tuples(parameter: str, *fields: tuple[str, TypeEngine[Any]]) -> Subquery:
    """The rows of a JSON array of arrays bound as one parameter
    (``jsonb_array_elements``), each inner array's items in the order of ``fields``
    (name, type): a JSON ``null`` is SQL ``NULL`` (as ``jsonb_to_recordset`` makes it).

    Postgres reads such a document in about two thirds of the time of the same rows as
    objects for ``jsonb_to_recordset`` (no key to look up, less to parse), and the
    client encodes a third of the bytes (no key names)."""
    element = func.jsonb_array_elements(bindparam(parameter, type_=_JSONB)).table_valued(
        column("value", _JSONB)
    )
    items: list[ColumnElement[Any]] = []
    for index, (name, type_) in enumerate(fields):
        position = literal_column(str(index), Integer)
        if isinstance(type_, JSONB):
            item = element.c.value.op("->", return_type=_JSONB)(position)
            items.append(func.nullif(item, literal_column("'null'::jsonb", _JSONB)).label(name))
        else:
            text_item = element.c.value.op("->>", return_type=String())(position)
            items.append(
                (text_item if isinstance(type_, String) else cast(text_item, type_)).label(name)
            )
    return select(*items).subquery(parameter)


def status_by_key(status: ColumnElement[str]) -> ColumnElement[str]:
    """``status`` as a term no index may serve (``status || ''``).

    For a status filter on rows found by primary key. The planner's statistics
    of the status column are stale by nature (an ``ANALYZE`` of a drained
    table saw no running job), so Postgres may read every ``running`` entry of
    the status index, dead ones included, to complete ten jobs it could look up
    by id.
    """
    return status.op("||", return_type=status.type)(literal_column("''"))


_FIRST_JOB_FIELDS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("id", String()),
    ("type_name", String()),
    ("input", _JSONB),
    ("status", String()),
    ("priority", Integer()),
    ("scheduled_at", DateTime(timezone=True)),  # NULL: the start's time
    ("max_attempts", Integer()),
    ("dedup_key", String()),
    ("blockers_pending", Integer()),
    ("trace_context", String()),
    ("concurrency_key", String()),
)
"""The items of each row of :meth:`PostgresStatements.insert_first_jobs`' document."""

_FINISHED_JOB_FIELDS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("job_id", String()),
    ("lease_token", String()),
    ("output", _JSONB),
    ("finishes", Boolean()),
)
"""The items of each row of :meth:`PostgresStatements.complete`'s ``done`` document."""

_NEXT_JOB_FIELDS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("previous_id", String()),
    ("id", String()),
    ("type_name", String()),
    ("input", _JSONB),
    ("priority", Integer()),
    ("scheduled_at", DateTime(timezone=True)),  # NULL: the completion's time
    ("max_attempts", Integer()),
    ("trace_context", String()),
    ("concurrency_key", String()),
)
"""The items of each row of :meth:`PostgresStatements.complete`'s ``follow`` document."""


class PostgresStatements:
    """The Postgres-only statements on one table set."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.job_columns = job_columns(tables)

    def claim_limited(
        self, type_name: str, *, worker_id: str, leased_until: datetime, limit: int, now: datetime
    ) -> Query:
        """Claim up to ``limit`` due jobs of a limited type within its limits: one call
        of the function ``{prefix}claim_limited`` (migration 0007). Its rows: the
        claim's ``outcome``, then a claimed job's columns, null when it claimed none
        (then it returns one row). The outcome, on one row only, is an object:
        ``control``, ``budget``, ``rate_bound``, ``frees_at`` and ``claimed_at`` (seconds
        since the epoch), ``picked``."""
        params = {
            "t": type_name,
            "worker": worker_id,
            "until": leased_until,
            "n": limit,
            "now": now,
            "max_keys": MAX_KEYS_VISITED,
            "window": UNKEYED_WINDOW,
            "steps": RATE_STEPS,
        }
        return Query(self._claim_limited, params)

    @cached_property
    def _claim_limited(self) -> TextualSelect:
        quote = _POSTGRES.identifier_preparer
        name = quote.quote(self.tables.claim_function)
        if self.tables.schema is not None:
            name = f"{quote.quote_schema(self.tables.schema)}.{name}"
        call = text(
            f"SELECT * FROM {name}(CAST(:t AS varchar), CAST(:worker AS varchar), :until, "
            "CAST(:n AS integer), :now, CAST(:max_keys AS integer), CAST(:window AS integer), "
            "CAST(:steps AS integer))"
        ).bindparams(bindparam("until", type_=UtcDateTime()), bindparam("now", type_=UtcDateTime()))
        outcome = column("outcome", _JSONB)
        return call.columns(outcome, *(column(c.name, c.type) for c in self.job_columns))

    def insert_first_jobs(self, firsts: Sequence[FirstJob], now: datetime) -> Query:
        """Insert new chains and their first jobs, created at ``now`` (a chain row is
        made of its first job's), in one statement: a start outside a caller's
        transaction is one round trip whatever the batch size. The same rows as
        :meth:`FirstJob.row`'s, whose dicts are not built here."""
        batch = []
        for first in firsts:
            job = first.job
            # In the order of _FIRST_JOB_FIELDS; a job due now is sent without its time.
            due = due_at(job, now)
            batch.append(
                [
                    first.chain_id,
                    job.type_name,
                    job.input,
                    new_job_status(first.blockers_pending),
                    job.priority,
                    None if due is now else due.isoformat(),
                    job.max_attempts,
                    first.dedup_key,
                    first.blockers_pending,
                    job.trace_context,
                    job.concurrency_key,
                ]
            )
        return Query(self._insert_first_jobs, {"batch": batch, "now": now})

    def insert_first_job(self, job_row: Mapping[str, Any]) -> Query:
        """Insert one new chain and its first job, given the job's row, in one
        statement of plain ``VALUES``: what a start of one chain sends (an enqueue in
        the application's transaction, mostly). Postgres plans it in about half the
        time of :meth:`insert_first_jobs`' JSON document and runs it in about two
        thirds (it reads no document, twice), which counts where statements are
        planned on every run (client-side binding, as Django's)."""
        return Query(self._insert_first_job, job_row)

    @cached_property
    def _insert_first_job(self) -> Any:
        """``WITH new_chain AS (INSERT INTO chains VALUES (...)) INSERT INTO jobs
        VALUES (...)``, both rows bound from the job's row."""
        t = self.tables
        jobs = t.jobs.c
        values = {
            name: bindparam(name, type_=jobs[name].type)
            for name in (
                "id",
                "type_name",
                "input",
                "status",
                "priority",
                "created_at",
                "scheduled_at",
                "max_attempts",
                "deduplication_key",
                "blockers_pending",
                "trace_context",
                "concurrency_key",
            )
        }
        new_chain = (
            insert(t.chains)
            .values(
                id=values["id"],
                type_name=values["type_name"],
                created_at=values["created_at"],
                completed_at=null(),
                has_dependents=false(),
                dedup_key=values["deduplication_key"],
            )
            .cte("new_chain")
        )
        return (
            insert(t.jobs)
            # The first job's index and attempt are always 0: written into the SQL, not
            # bound (with client-side binding, as Django's, every parameter is quoted
            # into the statement's text on each run).
            .values(
                **values,
                chain_id=values["id"],
                chain_index=literal_column("0", Integer),
                attempt=literal_column("0", Integer),
            )
            .add_cte(new_chain)
        )

    @cached_property
    def _insert_first_jobs(self) -> Any:
        """``WITH new_chains AS (INSERT INTO chains SELECT ... FROM rows)
        INSERT INTO jobs SELECT ... FROM rows``, the rows being one JSON document
        (one parameter, encoded in one call, inputs embedded as they are)."""
        t = self.tables
        now = bindparam("now", type_=UtcDateTime())
        rows = _json_tuples("batch", *_FIRST_JOB_FIELDS)
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
            "chain_index": literal_column("0", Integer),
            "type_name": rows.c.type_name,
            "input": rows.c.input,
            "status": rows.c.status,
            "priority": rows.c.priority,
            "created_at": now,
            "scheduled_at": func.coalesce(rows.c.scheduled_at, now),
            "attempt": literal_column("0", Integer),
            "max_attempts": rows.c.max_attempts,
            "deduplication_key": rows.c.dedup_key,
            "blockers_pending": rows.c.blockers_pending,
            "trace_context": rows.c.trace_context,
            "concurrency_key": rows.c.concurrency_key,
        }
        return (
            insert(t.jobs)
            .from_select(list(job_values), select(*job_values.values()))
            .add_cte(new_chains)
        )

    def complete(
        self,
        completions: Sequence[FinishedJob],
        next_jobs: Sequence[Mapping[str, Any]],
        now: datetime,
        *,
        alone: bool,
        records: bool,
    ) -> Query:
        """Complete leased jobs, create the next jobs of continued chains
        and make finished chains final, in one statement of fixed shape.

        ``next_jobs``: rows with ``previous_id``, created only if that job completed.
        Rows: every completed job (whole with ``records``; else only its ``id`` and
        ``type_name``), then ``finalized_id`` and ``has_dependents`` for the chains it made
        final. A chain row that another
        transaction holds is waited for and then read as committed, so
        ``has_dependents`` is current.

        ``alone``: the statement is its own transaction (autocommit, one round
        trip). Unblocking the dependents of a chain needs a later statement of the
        same transaction (it must see the jobs blocked while the chain row was
        waited for), so then a chain with dependents makes the statement fail with
        :data:`NEEDS_TRANSACTION` in the error, and nothing is written: run it again
        in a transaction.
        """
        # Rows in the order of _FINISHED_JOB_FIELDS and _NEXT_JOB_FIELDS, as lists (an
        # engine's json_serializer may refuse a tuple's subclass, as orjson does); a next
        # job due now is sent without its time.
        done = [[c.job_id, c.lease_token, c.output, c.finishes] for c in completions]
        follow = [
            [
                row["previous_id"],
                row["id"],
                row["type_name"],
                row["input"],
                row["priority"],
                None if row["scheduled_at"] is now else row["scheduled_at"].isoformat(),
                row["max_attempts"],
                row["trace_context"],
                row["concurrency_key"],
            ]
            for row in next_jobs
        ]
        ids = [c.job_id for c in completions]
        params = {"done": done, "ids": ids, "follow": follow, "now": now, "alone": alone}
        return Query(self._complete_records if records else self._complete_ids, params)

    @cached_property
    def _complete_records(self) -> Any:
        done, continued, final = self._completion_ctes(records=True)
        return (
            select(*(done.c[c.name] for c in self.job_columns), *self._finalization_columns(final))
            .select_from(done.outerjoin(final, final.c.id == done.c.chain_id))
            .add_cte(continued)
        )

    @cached_property
    def _complete_ids(self) -> Any:
        done, continued, final = self._completion_ctes(records=False)
        # Only what a completion without records reads: every further column is one more
        # for the driver to parse and load in each row of every batch a worker writes.
        return (
            select(done.c.id, done.c.type_name, *self._finalization_columns(final))
            .select_from(done.outerjoin(final, final.c.id == done.c.chain_id))
            .add_cte(continued)
        )

    def _finalization_columns(self, final: Any) -> list[ColumnElement[Any]]:
        """The chain a completion made final, whether jobs wait on it, and the refusal
        of a one-statement completion that must run in a transaction (see
        :meth:`complete`)."""
        return [
            final.c.id.label("finalized_id"),
            final.c.has_dependents,
            # An error raised from SQL rolls the whole statement back.
            cast(
                case(
                    (
                        and_(bindparam("alone", type_=Boolean()), final.c.has_dependents),
                        literal(NEEDS_TRANSACTION),
                    ),
                    else_=null(),
                ),
                Integer(),
            ).label("refused"),
        ]

    def _completion_ctes(self, *, records: bool) -> tuple[Any, Any, Any]:
        """The CTEs that complete the jobs (``done``, returning whole rows
        with ``records`` or else what the other CTEs need), create continuations
        (``continued``) and make finished chains final (``final``)."""
        t = self.tables
        jobs, chains = t.jobs, t.chains
        now = bindparam("now", type_=UtcDateTime())
        given = _json_tuples("done", *_FINISHED_JOB_FIELDS)
        returned = (
            self.job_columns
            if records
            else [
                jobs.c.id,
                jobs.c.type_name,
                jobs.c.chain_id,
                jobs.c.chain_index,
                jobs.c.concurrency_key,
            ]
        )
        done = (
            update(jobs)
            .where(
                # The ids again as an array: a generic plan estimates a JSON document's
                # rows at 100 and, below some 20,000 jobs, would scan the table to join it.
                jobs.c.id == func.any(bindparam("ids", type_=ARRAY(String()))),
                jobs.c.id == given.c.job_id,
                jobs.c.lease_token == given.c.lease_token,
                status_by_key(jobs.c.status) == "running",
            )
            .values(status="completed", output=given.c.output, completed_at=now, leased_until=None)
            .returning(*returned, given.c.finishes)
            .cte("done")
        )
        follow = _json_tuples("follow", *_NEXT_JOB_FIELDS)
        next_values = {
            "id": follow.c.id,
            "chain_id": done.c.chain_id,
            "chain_index": done.c.chain_index + 1,
            "type_name": follow.c.type_name,
            "input": follow.c.input,
            "status": literal("pending"),
            "priority": follow.c.priority,
            "created_at": now,
            "scheduled_at": func.coalesce(follow.c.scheduled_at, now),
            "attempt": literal_column("0", Integer),
            "max_attempts": follow.c.max_attempts,
            "blockers_pending": literal_column("0", Integer),
            "trace_context": follow.c.trace_context,
            # A continuation keeps its chain's key unless given one.
            "concurrency_key": func.coalesce(follow.c.concurrency_key, done.c.concurrency_key),
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
