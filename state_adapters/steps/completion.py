"""Completing leased jobs: what every database does around its own completion
algorithm (:meth:`Database.complete <state_adapters.database.Database.complete>`) —
one completion per job, the continuations created only for completions that held,
the notifications owed, the dependents of finished chains released, and a claim on
the same connection when the caller wants one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from state_adapters.errors import JobOwnershipLostError
from state_adapters.model import Completion, JobRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.statements.queue import Query
from state_adapters.statements.records import next_job_row
from state_adapters.steps.finishing import after_finalizing
from state_adapters.steps.job_logs import write_lines

if TYPE_CHECKING:
    from state_adapters.database import Conn, Database


class FinishedJob(NamedTuple):
    """One completion as the statements take it."""

    job_id: str
    lease_token: str
    output: Any
    """The job's output (None for a continued chain)."""
    finishes: bool
    """Whether the chain completes with this job (no ``continue_with``)."""


class Completed(NamedTuple):
    """What a database's completion wrote."""

    done: dict[str, Any]
    """Per completed job id: its ``JobRecord`` (or, without records, a row with at
    least its ``id`` and ``type_name``)."""
    finalized: list[tuple[str, bool]]
    """The chains made final, and whether jobs wait on each."""


async def complete(
    db: Database,
    conn: Conn,
    notes: NotificationBuffer,
    completions: Sequence[Completion],
    now: datetime,
    *,
    alone: bool = False,
    records: bool = True,
    claim: Query | Callable[[Conn], Awaitable[list[JobRecord]]] | None = None,
    limited: frozenset[str] = frozenset(),
) -> tuple[list[Any], list[JobRecord]]:
    """Complete ``completions``: per completion the completed job (a ``JobRecord``,
    or without ``records`` a row with at least its ``id`` and ``type_name``) or a
    ``JobOwnershipLostError`` (a stale token, or a job completed twice in the batch);
    with ``claim`` (a claim statement, or a function that claims on ``conn``), then run
    that claim and return its jobs in claim order. A
    completed job of a ``limited`` type frees a slot: its type is noted as
    scheduled, so a job held back by the limit starts at once."""
    first: dict[str, Completion] = {}
    for completion in completions:
        first.setdefault(completion.job_id, completion)
    # The next job of every continued chain, created only if its
    # predecessor's completion holds.
    next_jobs = [
        next_job_row(c.continue_with.job, previous_id=c.job_id, now=now)
        for c in first.values()
        if c.continue_with is not None
    ]
    finished = [
        FinishedJob(
            c.job_id, c.lease_token, None if c.continue_with else c.output, not c.continue_with
        )
        for c in first.values()
    ]
    done, finalized = await db.complete(
        conn, finished, next_jobs, now, alone=alone, records=records
    )
    # The lines of the jobs whose completion held, with it: one statement for the batch.
    await write_lines(
        conn,
        db.chains.tables,
        [line for c in first.values() if c.job_id in done for line in c.log_lines],
    )
    for row in next_jobs:
        if row["previous_id"] in done:
            notes.job_scheduled(row["type_name"])
    if limited:
        for record in done.values():
            if record.type_name in limited:
                notes.job_scheduled(record.type_name)
    await after_finalizing(db, conn, notes, finalized)
    if claim is None:
        claimed = []
    elif isinstance(claim, Query):
        claimed = await claim_jobs(db, conn, claim)
    else:
        claimed = await claim(conn)  # claims of limited types, then the plain claim
    results: list[Any] = []
    seen: set[str] = set()
    for completion in completions:
        record = done.get(completion.job_id)
        if record is None or completion.job_id in seen:
            results.append(ownership_lost(completion.job_id))
        else:
            results.append(record)
            seen.add(completion.job_id)
    return results, claimed


async def claim_jobs(db: Database, conn: Conn, claim: Query) -> list[JobRecord]:
    """Run a claim (:meth:`Statements.claim`, compiled once); its jobs in claim order."""
    rows = await db.compiled(claim.statement).rows(conn, claim.params)
    jobs = [JobRecord(*row) for row in rows]
    # A statement returns its rows in any order.
    jobs.sort(key=lambda j: (j.priority, j.scheduled_at, j.id))
    return jobs


def _finished(completion: Completion) -> FinishedJob:
    if completion.continue_with is not None:
        return FinishedJob(completion.job_id, completion.lease_token, None, finishes=False)
    return FinishedJob(completion.job_id, completion.lease_token, completion.output, finishes=True)


def ownership_lost(job_id: str) -> JobOwnershipLostError:
    """The error of a write whose lease token is stale."""
    return JobOwnershipLostError(
        f"job {job_id}: the lease token is stale (lease expired and reaped, job cancelled, "
        "or completed elsewhere); nothing was written"
    )
