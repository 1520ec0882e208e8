"""Reads that show the queue to people (the dashboard, the CLI): the overview by type
and status, chain search with keyset paging, and the links between chains. Their SQL,
and the indexes that bound each read, are in :mod:`state_adapters.statements.inspection`."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from state_adapters.arguments import (
    check_id_cursor,
    check_key,
    check_limit,
    check_optional_key,
    check_status,
)
from state_adapters.errors import InvalidInputError
from state_adapters.model import ActivityMinute, ChainLinks, JobStatus, Page, QueueOverview
from state_adapters.schema import Tables
from state_adapters.statements.inspection import InspectionStatements
from state_adapters.statements.records import chain_record

if TYPE_CHECKING:
    from state_adapters.database import Database
    from state_adapters.transactions.calls import Transactions

MAX_FINISHED_LIMIT = 10_000_000


class Inspection:
    """The inspection reads of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`
    (see :class:`~state_adapters.protocol.StateAdapter` for what each promises)."""

    tables: Tables
    _db: Database
    _transactions: Transactions

    @cached_property
    def _inspection(self) -> InspectionStatements:
        return InspectionStatements(self.tables, self._db.sql.dialect)

    async def queue_overview(
        self, *, since: datetime, finished_limit: int = 100_000
    ) -> QueueOverview:
        """Unfinished jobs now and jobs finished since ``since`` (the most recent
        ``finished_limit``), by type and status, and per minute. Two reads on one
        connection, of a few hundred rows at most."""
        if not isinstance(since, datetime) or since.utcoffset() is None:
            raise InvalidInputError(f"since must be a timezone-aware datetime, got {since!r}")
        finished_limit = _check_count(finished_limit, "finished_limit", MAX_FINISHED_LIMIT)
        unfinished: dict[str, dict[str, int]] = defaultdict(dict)
        finished: dict[str, dict[str, int]] = defaultdict(dict)
        minutes: dict[datetime, dict[str, int]] = defaultdict(dict)
        counted = 0
        async with self._transactions.read(None) as conn:
            for type_name, status, count in await conn.execute(
                *self._inspection.unfinished_counts()
            ):
                unfinished[type_name][status] = int(count)
            query = self._inspection.finished_per_minute(since, finished_limit)
            for minute, type_name, status, count in await conn.execute(*query):
                per_type = finished[type_name]
                per_type[status] = per_type.get(status, 0) + int(count)
                per_minute = minutes[minute]
                per_minute[status] = per_minute.get(status, 0) + int(count)
                counted += int(count)
        return QueueOverview(
            since=since,
            unfinished=dict(unfinished),
            finished=dict(finished),
            minutes=[
                ActivityMinute(
                    start=start,
                    completed=counts.get("completed", 0),
                    failed=counts.get("failed", 0),
                    cancelled=counts.get("cancelled", 0),
                )
                for start, counts in sorted(minutes.items())
            ],
            truncated=counted >= finished_limit,
        )

    async def find_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        search: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Chains newest first, filtered by status, type and id or deduplication key,
        keyset-paginated by id."""
        check_status(status)
        check_optional_key(type_name, "type_name")
        check_optional_key(search, "search")
        limit = check_limit(limit)
        query = self._inspection.find_chains(
            status, type_name, search, limit + 1, check_id_cursor(after)
        )
        async with self._transactions.read(None) as conn:
            rows = (await conn.execute(*query)).mappings().all()
        items = [chain_record(row) for row in rows[:limit]]
        return Page(items, items[-1].id if len(rows) > limit else None)

    async def chain_links(self, chain_id: str, *, limit: int = 100) -> ChainLinks:
        """The chains ``chain_id`` is blocked by and the chains it blocks."""
        check_key(chain_id, "chain_id")
        limit = check_limit(limit)
        async with self._transactions.read(None) as conn:
            blocked_by = (await conn.execute(*self._inspection.blocked_by(chain_id, limit))).all()
            blocking = (await conn.execute(*self._inspection.blocking(chain_id, limit))).all()
        return ChainLinks(
            blocked_by=[row[0] for row in blocked_by], blocking=[row[0] for row in blocking]
        )


def _check_count(value: Any, what: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidInputError(f"{what} must be an int from 1 to {most}, got {value!r}")
    return value
