"""The SQL of claims of a limited type on SQLite (:mod:`state_adapters.steps.limited_claims`;
Postgres runs them as one function, migration 0007): read the type's control row and
its running jobs, find candidates fairly across concurrency keys, claim them, and
record the starts. Same calling convention as :mod:`state_adapters.statements.queue`; each
statement has one shape (so SQLite compiles it once), with the type and the counts
bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    Select,
    String,
    Update,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    type_coerce,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.schema import Tables, UtcDateTime, json_type
from state_adapters.statements.dialect import SqlDialect
from state_adapters.statements.queue import Query, job_columns

if TYPE_CHECKING:
    from state_adapters.steps.limited_claims import RateWindow

UNKEYED_WINDOW = 1_000
"""How many of a key-limited type's best due jobs are looked through for jobs
without a concurrency key (they form one key of their own, served at the start of
every round of keys)."""


class LimitedClaimStatements:
    """The statements of limited claims on one table set."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.job_columns = job_columns(tables)

    @property
    def _pending(self) -> ColumnElement[str]:
        # Written into the SQL, so the partial indexes of pending jobs serve it.
        return literal_column("'pending'")

    def read_control(self, type_name: str) -> Query:
        """The type's control row with its running jobs per concurrency key, as
        ``running``: ``[key, count]`` pairs (key ``None``: jobs without one), read off
        the status index. One statement: the write transaction already holds the
        database, so nothing can change between the two reads."""
        return Query(self._read_control, {"t": type_name})

    @cached_property
    def _read_control(self) -> Select[Any]:
        c = self.tables.type_controls.c
        jobs = self.tables.jobs
        # ``likelihood``: statistics taken while no job ran (an ANALYZE after a fill)
        # make SQLite scan every job rather than read the running ones off the status
        # index; running jobs are a few among many.
        running_now = func.likelihood(
            jobs.c.status == literal_column("'running'"), literal_column("0.001")
        )
        per_key = (
            select(jobs.c.concurrency_key.label("key"), func.count().label("n"))
            .where(running_now, jobs.c.type_name == bindparam("t"))
            .group_by(jobs.c.concurrency_key)
            .subquery()
        )
        running = (
            select(func.json_group_array(func.json_array(per_key.c.key, per_key.c.n)))
            .scalar_subquery()
            .label("running")
        )
        return select(
            c.paused,
            c.concurrency,
            c.key_concurrency,
            c.rate,
            c.per_seconds,
            c.recent_starts,
            c.earlier_starts,
            c.step_at,
            c.step_starts,
            c.next_key_after,
            type_coerce(running, JSON()).label("running"),
        ).where(c.type_name == bindparam("t"))

    def claim_best(
        self, type_name: str, limit: int, *, worker_id: str, leased_until: datetime, now: datetime
    ) -> Query:
        """Claim the type's best ``limit`` due pending jobs (priority, scheduled_at, id)
        in one statement; their rows."""
        params = {
            "t": type_name,
            "n": limit,
            "now": now,
            "b_worker_id": worker_id,
            "b_leased_until": leased_until,
        }
        return Query(self._claim_best, params)

    @cached_property
    def _claim_best(self) -> Update:
        jobs = self.tables.jobs
        best = self._due_in_claim_order(jobs.c.id).limit(bindparam("n", type_=Integer()))
        return self._claiming(self.dialect.id_in_selected(jobs.c.id, best))

    def _due_in_claim_order(self, *columns: ColumnElement[Any]) -> Select[Any]:
        """``columns`` of the type's (``t``) pending jobs due at ``now``, in claim order
        (priority, scheduled_at, id)."""
        jobs = self.tables.jobs
        return (
            select(*columns)
            .where(
                jobs.c.status == self._pending,
                jobs.c.type_name == bindparam("t"),
                self.dialect.without_index(jobs.c.scheduled_at)
                <= bindparam("now", type_=UtcDateTime()),
            )
            .order_by(jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
        )

    def unkeyed_due(self, type_name: str, limit: int, now: datetime) -> Query:
        """Up to ``limit`` due jobs of the type without a concurrency key, in claim
        order, among its best :data:`UNKEYED_WINDOW` due jobs (a bounded look)."""
        return Query(self._unkeyed_due, {"t": type_name, "n": limit, "now": now})

    @cached_property
    def _unkeyed_due(self) -> Select[Any]:
        jobs = self.tables.jobs
        best = (
            self._due_in_claim_order(
                jobs.c.id, jobs.c.concurrency_key, jobs.c.priority, jobs.c.scheduled_at
            )
            .limit(UNKEYED_WINDOW)
            .subquery()
        )
        return (
            select(best.c.id)
            .where(best.c.concurrency_key.is_(None))
            .order_by(best.c.priority, best.c.scheduled_at, best.c.id)
            .limit(bindparam("n", type_=Integer()))
        )

    def walk_keys(
        self, type_name: str, *, after: str, keys: int, offset: int, now: datetime
    ) -> Query:
        """The type's next ``keys`` concurrency keys after ``after`` (in key order)
        that have pending jobs, each with the id of its due job at ``offset`` in claim
        order (null if it has none).

        One index probe per key (a recursive walk of the keyed-pending index), so the
        cost follows the keys visited, never the jobs waiting behind them."""
        params = {"t": type_name, "after": after, "keys": keys, "offset": offset, "now": now}
        return Query(self._walk_keys, params)

    @cached_property
    def _walk_keys(self) -> Select[Any]:
        jobs = self.tables.jobs
        t = bindparam("t", type_=String())

        def next_key(after: ColumnElement[Any]) -> Any:
            return (
                select(jobs.c.concurrency_key)
                .where(
                    jobs.c.status == self._pending,
                    jobs.c.type_name == t,
                    jobs.c.concurrency_key > after,
                )
                .order_by(jobs.c.concurrency_key)
                .limit(1)
                .scalar_subquery()
            )

        first = select(
            next_key(bindparam("after", type_=String())).label("key"),
            literal(1, Integer()).label("n"),
        )
        walk = first.cte("walk", recursive=True)
        walk = walk.union_all(
            select(next_key(walk.c.key), (walk.c.n + 1).label("n")).where(
                walk.c.key.is_not(None), walk.c.n < bindparam("keys", type_=Integer())
            )
        )
        head = (
            select(jobs.c.id)
            .where(
                jobs.c.status == self._pending,
                jobs.c.type_name == t,
                jobs.c.concurrency_key == walk.c.key,
                jobs.c.scheduled_at <= bindparam("now", type_=UtcDateTime()),
            )
            .order_by(jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
            .limit(1)
            .offset(bindparam("offset", type_=Integer()))
            .scalar_subquery()
        )
        return select(walk.c.key, head.label("job_id")).where(walk.c.key.is_not(None))

    def claim_ids(self, job_ids: Sequence[str], *, worker_id: str, leased_until: datetime) -> Query:
        """Mark these jobs running under fresh leases if they are still pending (a
        stale plain claimer or a cancel may have taken one meanwhile); their rows."""
        params = {
            "ids": list(job_ids),
            "b_worker_id": worker_id,
            "b_leased_until": leased_until,
        }
        return Query(self._claim_ids, params)

    @cached_property
    def _claim_ids(self) -> Update:
        return self._claiming(self.dialect.in_list(self.tables.jobs.c.id, "ids"))

    def _claiming(self, chosen: ColumnElement[bool]) -> Update:
        """Mark the ``chosen`` jobs that are still pending running under fresh leases."""
        jobs = self.tables.jobs
        return (
            update(jobs)
            .where(
                chosen,
                # The rows come by primary key, never through the status index.
                self.dialect.without_index(jobs.c.status) == self._pending,
            )
            .values(
                status="running",
                attempt=jobs.c.attempt + 1,
                leased_by=bindparam("b_worker_id"),
                lease_token=self.dialect.random_token(),
                leased_until=bindparam("b_leased_until", type_=UtcDateTime()),
            )
            .returning(*self.job_columns)
        )

    def save_state(
        self, type_name: str, window: RateWindow | None, next_key_after: str | None
    ) -> Query:
        """Store the rate's window (its earlier steps only when the claim began a
        step: otherwise they are as stored) and the key served last."""
        params: dict[str, Any] = {"t": type_name, "b_after": next_key_after}
        if window is None:
            return Query(self._save_key, params)
        params.update(b_step_at=window.step_at, b_step_starts=window.step_starts)
        if not window.folded:
            return Query(self._save_step, params)
        params.update(b_starts=window.entries, b_earlier=window.earlier_starts)
        return Query(self._save_window, params)

    @cached_property
    def _save_key(self) -> Update:
        controls = self.tables.type_controls
        return (
            update(controls)
            .where(controls.c.type_name == bindparam("t"))
            .values(next_key_after=bindparam("b_after", type_=String()))
        )

    @cached_property
    def _save_step(self) -> Update:
        return self._save_key.values(
            step_at=bindparam("b_step_at", type_=Float()),
            step_starts=bindparam("b_step_starts", type_=Integer()),
        )

    @cached_property
    def _save_window(self) -> Update:
        return self._save_step.values(
            recent_starts=bindparam("b_starts", type_=json_type()),
            earlier_starts=bindparam("b_earlier", type_=Integer()),
        )
