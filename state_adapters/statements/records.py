"""Rows and records: the dicts the statements insert for new jobs, and the
``JobRecord``/``ChainRecord`` a read row becomes."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import RowMapping

from state_adapters.ids import new_id
from state_adapters.model import ChainRecord, JobRecord, NewJob
from state_adapters.statements.queue import JOB_FIELDS


def job_record(row: RowMapping) -> JobRecord:
    """The job of a row with every field of ``JOB_FIELDS``."""
    return JobRecord(*(row[name] for name in JOB_FIELDS))


def chain_record(row: RowMapping) -> ChainRecord:
    """The chain of a row of its last job plus ``chain_type_name``, ``chain_created_at``
    and ``chain_completed_at``."""
    job = job_record(row)
    return ChainRecord(
        id=job.chain_id,
        type_name=row["chain_type_name"],
        status=job.status,
        output=job.output,
        created_at=row["chain_created_at"],
        completed_at=row["chain_completed_at"],
        last_job=job,
    )


def due_at(job: NewJob, now: datetime) -> datetime:
    """When a new job created at ``now`` is due: its ``run_at``, or ``now`` itself (the
    same object) when it has none or it has passed."""
    return now if job.run_at is None or job.run_at < now else job.run_at


def new_job_status(blockers_pending: int) -> str:
    """A new job's status: blocked while it waits on other chains, else pending."""
    return "blocked" if blockers_pending else "pending"


def job_row(
    job: NewJob,
    *,
    job_id: str,
    chain_id: str,
    chain_index: int,
    now: datetime,
    dedup_key: str | None,
    blockers_pending: int,
) -> dict[str, Any]:
    """The row of a new job (pending, or blocked while ``blockers_pending``)."""
    return {
        "id": job_id,
        "chain_id": chain_id,
        "chain_index": chain_index,
        "type_name": job.type_name,
        "input": job.input,
        "output": None,
        "progress": None,
        "status": new_job_status(blockers_pending),
        "priority": job.priority,
        "created_at": now,
        "scheduled_at": due_at(job, now),
        "completed_at": None,
        "attempt": 0,
        "max_attempts": job.max_attempts,
        "last_error": None,
        "leased_by": None,
        "lease_token": None,
        "leased_until": None,
        "deduplication_key": dedup_key,
        "blockers_pending": blockers_pending,
        "trace_context": job.trace_context,
        "concurrency_key": job.concurrency_key,
    }


class FirstJob(NamedTuple):
    """A new chain's first job as the start step hands it to
    ``Database.insert_first_jobs``: a database that inserts rows makes them with
    :meth:`row`; Postgres' batch document takes its items from here in one pass (a dict
    per job first was most of the document's time)."""

    job: NewJob
    chain_id: str
    """The chain's id, and its first job's."""
    dedup_key: str | None
    blockers_pending: int

    def row(self, now: datetime) -> dict[str, Any]:
        """The job's row (:func:`job_row`), created at ``now``."""
        return job_row(
            self.job,
            job_id=self.chain_id,
            chain_id=self.chain_id,
            chain_index=0,
            now=now,
            dedup_key=self.dedup_key,
            blockers_pending=self.blockers_pending,
        )


def next_job_row(job: NewJob, *, previous_id: str, now: datetime) -> dict[str, Any]:
    """The row of a chain's next job; its chain and index (and its concurrency key,
    unless the job has one) come from ``previous_id``'s row, and it is written only if
    that job's completion holds."""
    row = job_row(
        job,
        job_id=new_id(),
        chain_id="",
        chain_index=0,
        now=now,
        dedup_key=None,
        blockers_pending=0,
    )
    del row["chain_id"], row["chain_index"]
    return {**row, "previous_id": previous_id}
