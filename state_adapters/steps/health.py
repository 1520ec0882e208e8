"""The health report (:mod:`state_adapters.health`): the backlog every database shares,
read here, and what only one database can tell, asked of its
:class:`~state_adapters.database.Database`. Every read is of a system view, a pragma or
a partial index of unfinished jobs: the report costs the same on a table of a million
finished jobs as on an empty one, and it never writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select, true, type_coerce

from state_adapters.schema import UtcDateTime

# The report's classes (state_adapters.health: nine dataclasses, ~45 M instructions to
# define) are imported by the functions that build a report, not with the adapter: a
# command that only reads chains never needs them.
if TYPE_CHECKING:
    from state_adapters.database import Database
    from state_adapters.health import Backlog, Finding, HealthReport, HealthThresholds
    from state_adapters.protocol import StateAdapter
    from state_adapters.transactions.calls import CallerSession, Transactions


class HealthCheck:
    """:meth:`health` of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions

    async def health(
        self, *, thresholds: HealthThresholds | None = None, session: CallerSession = None
    ) -> HealthReport:
        """The queue's health now (see :mod:`state_adapters.health`): reads only, on
        the caller's connection or one of the adapter's own."""
        from state_adapters.health import SEVERITIES, HealthReport, HealthThresholds

        limits = thresholds or HealthThresholds()
        async with self._transactions.read(session) as conn:
            backlog = await _read_backlog(self._db, conn, limits)
            storage = await self._db.storage_health(conn, limits)
        findings = [*storage.findings, *backlog_findings(backlog, limits)]
        return HealthReport(
            database=self._db.sql.dialect.name,
            checked_at=datetime.now(UTC),
            findings=sorted(findings, key=lambda f: -SEVERITIES.index(f.severity)),
            backlog=backlog,
            tables=storage.tables,
            indexes=storage.indexes,
            horizon=storage.horizon,
            vacuums=storage.vacuums,
            facts=storage.facts,
        )


async def _read_backlog(db: Database, conn: Any, limits: HealthThresholds) -> Backlog:
    """One read of the partial indexes of pending and running jobs."""
    from state_adapters.health import Backlog

    jobs, controls = db.sql.tables.jobs, db.sql.tables.type_controls
    now = datetime.now(UTC)
    due = jobs.c.scheduled_at <= now
    paused = select(controls.c.type_name).where(controls.c.paused).scalar_subquery()
    pending = (
        select(
            func.count().label("waiting"),
            func.coalesce(func.sum(case((due, 1), else_=0)), 0).label("due"),
            type_coerce(func.min(case((due, jobs.c.scheduled_at))), UtcDateTime()).label(
                "oldest_due"
            ),
        )
        .where(jobs.c.status == "pending", jobs.c.type_name.not_in(paused))
        .subquery("pending")
    )
    expired_before = now - timedelta(seconds=limits.lease_grace)
    expired = (
        select(
            func.count().label("lapsed"),
            type_coerce(func.min(jobs.c.leased_until), UtcDateTime()).label("oldest_lease"),
        )
        .where(jobs.c.status == "running", jobs.c.leased_until < expired_before)
        .subquery("expired")
    )
    row = (
        await conn.execute(select(pending, expired).select_from(pending.join(expired, true())))
    ).one()
    waiting, due_count, oldest_due, lapsed, oldest_lease = row
    return Backlog(
        pending=int(waiting),
        due=int(due_count),
        oldest_due_wait=None if oldest_due is None else (now - oldest_due).total_seconds(),
        expired_leases=int(lapsed),
        oldest_expired=None if oldest_lease is None else (now - oldest_lease).total_seconds(),
    )


def backlog_findings(backlog: Backlog, limits: HealthThresholds) -> list[Finding]:
    """The due jobs' wait and the lapsed leases, judged."""
    from state_adapters.health import Finding, duration

    findings: list[Finding] = []
    wait = backlog.oldest_due_wait or 0.0
    if backlog.oldest_due_wait is not None and wait >= limits.due_wait:
        findings.append(
            Finding(
                "critical" if wait >= limits.due_wait_critical else "warning",
                "backlog",
                f"{backlog.due} jobs are due; the oldest has waited {duration(wait)}",
                "workers are not keeping up with these types, or none is running for them",
                "check the workers (`queuert-notify workers`, the dashboard) and add workers or "
                "concurrency; if claims got slow, see the horizon and dead-row findings",
            )
        )
    else:
        findings.append(
            Finding(
                "ok",
                "backlog",
                f"{backlog.pending} pending, {backlog.due} due"
                + (f", the oldest due for {duration(wait)}" if backlog.due else ""),
                "workers keep up",
                "nothing",
            )
        )
    if backlog.expired_leases:
        lapsed = duration(backlog.oldest_expired or 0.0)
        findings.append(
            Finding(
                "warning",
                "leases",
                f"{backlog.expired_leases} running jobs' leases ran out, the oldest {lapsed} ago",
                "their workers died or hang; the jobs wait until a worker of their type "
                "with an idle slot reaps them back to pending",
                "start a worker for their types, or find the workers that stopped renewing",
            )
        )
    return findings


async def counts_only(state: StateAdapter) -> HealthReport:
    """The report of an adapter without a database to ask (``StateAdapterBase``'s
    default): the pending jobs only (due ones unknown, counted 0)."""
    from state_adapters.health import Backlog, Finding, HealthReport

    pending = (await state.count_jobs()).get("pending", 0)
    return HealthReport(
        database=type(state).__name__,
        checked_at=datetime.now(UTC),
        findings=[
            Finding(
                "ok",
                "database",
                f"{pending} pending jobs; this adapter reads nothing else of its database",
                "the report cannot see dead rows, old transactions or how long jobs wait",
                "implement health() on the adapter (state_adapters.protocol.StateAdapter)",
            )
        ],
        backlog=Backlog(pending, 0, None, 0, None),
    )
