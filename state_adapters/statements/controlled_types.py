"""Which jobs a plain claim leaves alone: those of a paused or limited type (a row
in ``{prefix}type_controls`` with ``paused`` or a limit set). Limited types are
claimed by :mod:`state_adapters.steps.limited_claims`; paused ones by nobody."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.sql.elements import ColumnElement

from state_adapters.schema import Tables


def controlled(tables: Tables) -> ColumnElement[bool]:
    """True for a job whose type is paused or limited: a plain claim leaves it to the
    limited claim (:mod:`state_adapters.steps.limited_claims`), or to nobody while paused.

    ``type_name IN (the controlled types)``: an uncorrelated subquery, read once per
    statement (Postgres hashes it), so a claim still reads its jobs off the acquire
    index in claim order; a correlated ``EXISTS`` lets Postgres plan an anti join
    that reads and sorts every pending job."""
    controls, jobs = tables.type_controls, tables.jobs
    return jobs.c.type_name.in_(
        select(controls.c.type_name).where(
            or_(
                controls.c.paused,
                controls.c.concurrency.is_not(None),
                controls.c.key_concurrency.is_not(None),
                controls.c.rate.is_not(None),
            )
        )
    )
