"""The SQL of pausing and limiting job types (``{prefix}type_controls``): reading the
controls, writing them, and what a resume announces. (The term every plain claim
carries to leave controlled types alone is
:func:`state_adapters.statements.controlled_types.controlled`.) Same calling convention as
:mod:`state_adapters.statements.queue`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Delete,
    Select,
    Update,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    null,
    select,
    update,
)

from state_adapters.schema import Tables, UtcDateTime
from state_adapters.statements.dialect import SqlDialect
from state_adapters.statements.queue import Query

WAKE_COUNT_CAP = 10_000
"""Most pending jobs a resume (or new limits) announces: enough to wake every worker."""


class TypeControlStatements:
    """The statements of the type controls on one table set."""

    def __init__(self, tables: Tables, dialect: SqlDialect) -> None:
        self.tables = tables
        self.dialect = dialect

    def read_all(self) -> Query:
        """Every controlled type: name, paused, the four limit columns."""
        return Query(self._read_all, {})

    @cached_property
    def _read_all(self) -> Select[Any]:
        c = self.tables.type_controls.c
        return select(
            c.type_name, c.paused, c.concurrency, c.key_concurrency, c.rate, c.per_seconds
        ).order_by(c.type_name)

    def ensure_row(self, type_name: str) -> Query:
        """Create the type's row (not paused, no limits) unless it exists."""
        controls = self.tables.type_controls
        statement = self.dialect.insert_or_ignore(controls)
        return Query(statement, {"type_name": type_name, "paused": False})

    def set_paused(self, type_name: str, paused: bool) -> Query:
        """Pause or resume the type (its row exists)."""
        return Query(self._set_paused, {"t": type_name, "b_paused": paused})

    @cached_property
    def _set_paused(self) -> Update:
        controls = self.tables.type_controls
        return (
            update(controls)
            .where(controls.c.type_name == bindparam("t"))
            .values(paused=bindparam("b_paused"))
        )

    def set_limits(self, type_name: str, limits: Mapping[str, Any], forgotten: int = 0) -> Query:
        """Replace the type's limits (its row exists); lifting the rate forgets the
        recorded starts; ``forgotten`` starts are added to the newest step (see
        :func:`state_adapters.limited_claims.forgotten_starts`)."""
        controls = self.tables.type_controls
        values: dict[str, Any] = dict(limits)
        if limits["rate"] is None:
            values["recent_starts"] = null()  # SQL NULL: a JSON column writes None as 'null'
            values.update(step_at=None, step_starts=0, earlier_starts=0)
        elif forgotten:
            # Without a newest step no start was recorded: nothing was forgotten.
            values["step_starts"] = case(
                (controls.c.step_at.is_(None), controls.c.step_starts),
                else_=controls.c.step_starts + forgotten,
            )
        statement = update(controls).where(controls.c.type_name == type_name).values(**values)
        return Query(statement, {})

    def delete_if_idle(self, type_name: str) -> Query:
        """Delete the type's row when it is neither paused nor limited: an uncontrolled
        type has no row, so the table stays as small as the set of controlled types."""
        return Query(self._delete_if_idle, {"t": type_name})

    @cached_property
    def _delete_if_idle(self) -> Delete:
        c = self.tables.type_controls.c
        return delete(self.tables.type_controls).where(
            c.type_name == bindparam("t"),
            c.paused.is_(False),
            c.concurrency.is_(None),
            c.key_concurrency.is_(None),
            c.rate.is_(None),
        )

    def read_one(self, type_name: str) -> Query:
        """The type's row (name, paused, limits), if any."""
        c = self.tables.type_controls.c
        return Query(self._read_all.where(c.type_name == type_name), {})

    def next_scheduled(self, type_names: Sequence[str], now: datetime) -> Query:
        """The earliest ``scheduled_at`` after ``now`` of a pending job of these types."""
        return Query(self._next_scheduled, {"type_names": list(type_names), "now": now})

    @cached_property
    def _next_scheduled(self) -> Select[Any]:
        jobs = self.tables.jobs
        return select(func.min(jobs.c.scheduled_at)).where(
            jobs.c.status == literal_column("'pending'"),
            jobs.c.type_name.in_(bindparam("type_names", expanding=True)),
            jobs.c.scheduled_at > bindparam("now", type_=UtcDateTime()),
        )

    def count_due(self, type_name: str, now: datetime) -> Query:
        """Pending jobs of the type due by ``now``, counted up to :data:`WAKE_COUNT_CAP`."""
        return Query(self._count_due, {"t": type_name, "now": now})

    @cached_property
    def _count_due(self) -> Select[Any]:
        jobs = self.tables.jobs
        due = (
            select(jobs.c.id)
            .where(
                jobs.c.type_name == bindparam("t"),
                jobs.c.status == literal_column("'pending'"),
                jobs.c.scheduled_at <= bindparam("now", type_=UtcDateTime()),
            )
            .limit(WAKE_COUNT_CAP)
            .subquery()
        )
        return select(func.count()).select_from(due)
