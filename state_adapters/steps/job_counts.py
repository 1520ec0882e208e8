"""How many jobs of some types wait and run now, read at a cost that follows the
unfinished jobs rather than the table (for gauges polled while a worker runs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, select

from state_adapters.schema import Tables
from state_adapters.statements.queue import Query

ACTIVE_STATUSES = ("pending", "running")
"""The statuses :func:`count_active_jobs` counts."""


def count_active_jobs(tables: Tables, type_names: Sequence[str]) -> Query:
    """``(type_name, status, count)`` rows of the pending and running jobs of
    ``type_names``; served by the ``(status, type_name)`` index, so finished jobs are
    never read."""
    jobs = tables.jobs
    return Query(
        select(jobs.c.type_name, jobs.c.status, func.count())
        .where(jobs.c.status.in_(ACTIVE_STATUSES), jobs.c.type_name.in_(list(type_names)))
        .group_by(jobs.c.type_name, jobs.c.status),
        {},
    )


def active_counts(
    type_names: Sequence[str], rows: Iterable[Sequence[Any]]
) -> dict[str, dict[str, int]]:
    """Type name -> ``{"pending": n, "running": m}`` for every type of ``type_names``
    (zeros included) from the rows of :func:`count_active_jobs`."""
    counts: dict[str, dict[str, int]] = {
        name: dict.fromkeys(ACTIVE_STATUSES, 0) for name in type_names
    }
    for type_name, status, count in rows:
        counts[type_name][status] = int(count)
    return counts


def from_status_counts(by_status: Mapping[str, int]) -> dict[str, int]:
    """The pending and running counts of one type's ``count_jobs`` result."""
    return {status: int(by_status.get(status, 0)) for status in ACTIVE_STATUSES}
