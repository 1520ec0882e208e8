"""Which pending jobs a plain claim takes (the claim itself is
:meth:`~state_adapters.statements.queue.Statements.claim`): the best due jobs of the
claimed types, read off the acquire index in claim order, whatever the planner's
statistics say."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, bindparam, literal_column, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.schema import Tables, UtcDateTime
from state_adapters.statements.controlled_types import controlled
from state_adapters.statements.dialect import SqlDialect


def best_due(tables: Tables, dialect: SqlDialect, type_count: int, limit: int) -> Select[Any]:
    """The ids of the best ``limit`` due jobs of the types bound as ``type_0`` ...,
    locked for the claim (Postgres), in claim order (priority, scheduled_at, id).

    Of one type, they are read off the acquire index in claim order. Of several, the
    best ``limit`` of each type are read that way (each its own ordered index scan, row
    locks taken as it goes) and the best ``limit`` of those are taken: ``type_name IN
    (...)`` with ``ORDER BY`` would read and sort every due job of those types, per
    claim, however fresh the statistics (Postgres before 17 cannot walk an index in
    order across an IN list). The rows locked but not taken (at most ``limit`` per
    type) are released when the claim commits; a claimer racing it meanwhile skips
    them, as it skips rows being claimed."""
    jobs = tables.jobs
    order = (jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
    top: ColumnElement[int] = literal_column(str(int(limit)))

    def due(type_param: str, *columns: Any) -> Select[Any]:
        return select(jobs.c.id, *columns).where(
            jobs.c.status == literal_column("'pending'"),
            jobs.c.type_name == bindparam(type_param),
            # Read off the acquire index in claim order, never sorted from another.
            dialect.without_index(jobs.c.scheduled_at) <= bindparam("now", type_=UtcDateTime()),
            # Paused types wait; limited ones are claimed by limited_claims.
            ~controlled(tables),
        )

    if type_count == 1:
        return dialect.claim_lock(due("type_0").order_by(*order).limit(top))
    each = [
        select(
            dialect.claim_lock(
                due(f"type_{i}", jobs.c.priority, jobs.c.scheduled_at).order_by(*order).limit(top)
            ).subquery(f"best_{i}")
        )
        for i in range(type_count)
    ]
    candidates = union_all(*each).subquery("candidates")
    return (
        select(candidates.c.id)
        .order_by(candidates.c.priority, candidates.c.scheduled_at, candidates.c.id)
        .limit(top)
    )
