"""Reading chains and jobs: the state adapter's reads, one statement each (per
thousand ids), on the caller's connection or one of the database's readers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from state_adapters.arguments import (
    check_id_cursor,
    check_index_cursor,
    check_key,
    check_limit,
    check_optional_key,
    check_status,
    check_type_names,
)
from state_adapters.errors import InvalidInputError, JobNotFoundError
from state_adapters.model import ALL_STATUSES, ChainRecord, JobRecord, JobStatus, Page
from state_adapters.statements.records import chain_record, job_record
from state_adapters.steps import job_counts
from state_adapters.steps.chain_actions import read_chain

if TYPE_CHECKING:
    from state_adapters.database import Database
    from state_adapters.transactions.calls import CallerSession, Transactions

_IDS_PER_READ = 1000
"""Ids bound in one ``IN (...)`` read: far below every driver's parameter limit."""


class ChainReads:
    """The reads of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions

    async def get_chain(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """The chain as stored; raises ``ChainNotFoundError``."""
        check_key(chain_id, "chain_id")
        async with self._transactions.read(session) as conn:
            return await read_chain(self._db, conn, chain_id)

    async def get_chains(
        self, chain_ids: Sequence[str], *, session: CallerSession = None
    ) -> list[ChainRecord]:
        """The chains among ``chain_ids`` that exist, in the order given; unknown ids
        are left out. One read (per thousand ids)."""
        if isinstance(chain_ids, str):
            raise InvalidInputError("chain_ids must be a sequence of chain ids, not one string")
        wanted = [check_key(chain_id, "a chain id") for chain_id in dict.fromkeys(chain_ids)]
        found: dict[str, ChainRecord] = {}
        async with self._transactions.read(session) as conn:
            for start in range(0, len(wanted), _IDS_PER_READ):
                query = self._db.chains.get_chains(wanted[start : start + _IDS_PER_READ])
                for row in (await conn.execute(*query)).mappings():
                    chain = chain_record(row)
                    found[chain.id] = chain
        return [found[chain_id] for chain_id in wanted if chain_id in found]

    async def get_job(self, job_id: str, *, session: CallerSession = None) -> JobRecord:
        """The job as stored; raises ``JobNotFoundError``."""
        check_key(job_id, "job_id")
        async with self._transactions.read(session) as conn:
            row = (await conn.execute(*self._db.chains.get_job(job_id))).mappings().first()
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
        session: CallerSession = None,
    ) -> Page:
        """Chains newest first (ids are time-ordered), keyset-paginated by id."""
        check_status(status)
        check_optional_key(type_name, "type_name")
        limit = check_limit(limit)
        query = self._db.chains.list_chains(status, type_name, limit + 1, check_id_cursor(after))
        async with self._transactions.read(session) as conn:
            rows = (await conn.execute(*query)).mappings().all()
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
        session: CallerSession = None,
    ) -> Page:
        """Jobs newest first; with ``chain_id``, that chain's jobs in chain order."""
        check_status(status)
        check_optional_key(chain_id, "chain_id")
        check_optional_key(type_name, "type_name")
        limit = check_limit(limit)
        cursor = check_index_cursor(after) if chain_id is not None else check_id_cursor(after)
        query = self._db.chains.list_jobs(chain_id, status, type_name, limit + 1, cursor)
        async with self._transactions.read(session) as conn:
            rows = (await conn.execute(*query)).mappings().all()
        items = [job_record(row) for row in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            next_cursor = str(last.chain_index) if chain_id is not None else last.id
        return Page(items, next_cursor)

    async def count_jobs(
        self, *, type_names: Sequence[str] | None = None, session: CallerSession = None
    ) -> Mapping[str, int]:
        """Number of jobs per status (every status present, zero included)."""
        types = None if type_names is None else check_type_names(type_names)
        counts: dict[str, int] = dict.fromkeys(ALL_STATUSES, 0)
        async with self._transactions.read(session) as conn:
            for status, count in await conn.execute(*self._db.chains.count_jobs(types)):
                counts[status] = int(count)
        return counts

    async def count_active_jobs(self, type_names: Sequence[str]) -> Mapping[str, Mapping[str, int]]:
        """Pending and running jobs per type (see :mod:`state_adapters.steps.job_counts`)."""
        types = check_type_names(type_names)
        query = job_counts.count_active_jobs(self._db.chains.tables, types)
        async with self._transactions.read(None) as conn:
            rows = (await conn.execute(*query)).all()
        return job_counts.active_counts(types, rows)
