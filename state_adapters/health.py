"""The queue's health as its database sees it, as values: a report of findings, each
with a severity, what it means for the queue and what to do, and the readings behind
them. :mod:`state_adapters.steps.health` builds it: what every database shares (the
due backlog, running jobs whose lease expired) there, what only one database can tell
from the :class:`~state_adapters.database.Database` — Postgres' dead row versions,
vacuum and the transactions holding back its xmin horizon
(:mod:`state_adapters.postgres.health`), SQLite's WAL and pages
(:mod:`state_adapters.sqlite.health`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Severity = Literal["ok", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("ok", "warning", "critical")
"""From best to worst."""
DEFAULT_HORIZON_AGE = 60.0
"""Seconds from which a transaction holding back vacuum is a finding."""


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """When a reading becomes a finding (ages in seconds, sizes in bytes).

    ``horizon_age``: a transaction, snapshot or prepared transaction younger than this
    is not a finding (short ones come and go on any busy server);
    ``horizon_critical_age`` makes one critical. ``dead_ratio`` (warning) and
    ``dead_ratio_critical``: dead row versions as a share of a queue table, counted only
    from ``dead_rows`` on (a small table is vacuumed in a blink). ``stale_rows``: rows
    changed since the last ANALYZE, counted only when also more than the live rows.
    ``due_wait``/``due_wait_critical``: how long the oldest due job may have waited.
    ``lease_grace``: how long after its lease ran out a running job is a finding (a
    worker's reaper returns it to pending when it has an idle slot).
    ``index_bytes_per_entry``: an index of at least ``index_min_bytes`` above this many
    bytes per entry is bloated (a queue index entry takes 40 to 120).
    ``slot_xid_age``: transactions an active replication slot may hold the horizon
    back by. ``sqlite_wal_bytes``: the WAL file size that means checkpoints cannot
    keep up.
    """

    horizon_age: float = DEFAULT_HORIZON_AGE
    horizon_critical_age: float = 600.0
    dead_ratio: float = 0.2
    dead_ratio_critical: float = 0.5
    dead_rows: int = 10_000
    stale_rows: int = 100_000
    due_wait: float = 300.0
    due_wait_critical: float = 3600.0
    lease_grace: float = 60.0
    index_bytes_per_entry: int = 1024
    index_min_bytes: int = 8 * 1024 * 1024
    slot_xid_age: int = 1_000_000
    sqlite_wal_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the report found: what was seen (``summary``), what it means for the
    queue, and what to do; one or two lines each."""

    severity: Severity
    subject: str
    """What it is about: ``"xmin horizon"``, ``"table queuert_jobs"``, ``"backlog"``."""
    summary: str
    meaning: str
    action: str


@dataclass(frozen=True, slots=True)
class TableHealth:
    """One queue table as Postgres' statistics see it (estimates, refreshed by the
    server within a second or so of each change)."""

    name: str
    live_rows: int
    dead_rows: int
    modified_since_analyze: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    table_bytes: int
    index_bytes: int
    settings: tuple[str, ...]
    """The table's storage parameters (``autovacuum_vacuum_scale_factor=0.01``, ...)."""

    @property
    def dead_ratio(self) -> float:
        """Dead row versions as a share of all row versions (0 for an empty table)."""
        total = self.live_rows + self.dead_rows
        return self.dead_rows / total if total else 0.0

    @property
    def vacuumed_at(self) -> datetime | None:
        """The last VACUUM, by hand or by autovacuum."""
        return _latest(self.last_vacuum, self.last_autovacuum)

    @property
    def analyzed_at(self) -> datetime | None:
        """The last ANALYZE, by hand or by autovacuum."""
        return _latest(self.last_analyze, self.last_autoanalyze)


@dataclass(frozen=True, slots=True)
class IndexHealth:
    """One index of a queue table: its size and its entries at the last VACUUM
    (``None`` when it was never vacuumed or analyzed)."""

    name: str
    table: str
    bytes: int
    entries: int | None


@dataclass(frozen=True, slots=True)
class HorizonHolder:
    """Something that keeps vacuum from removing row versions deleted after it began:
    a transaction (a backend's snapshot or transaction id), a prepared transaction, or
    a replication slot. ``query`` is the first 80 characters of the backend's last
    statement with its string literals blanked (``'?'``); parameters are never read."""

    kind: Literal["transaction", "prepared transaction", "replication slot"]
    name: str
    """The backend's pid, the prepared transaction's gid or the slot's name."""
    age_seconds: float | None
    """Since the transaction began or was prepared (``None`` for a slot)."""
    xid_age: int | None
    """Transactions since the horizon it holds."""
    pid: int | None = None
    application_name: str | None = None
    state: str | None = None
    query: str | None = None


@dataclass(frozen=True, slots=True)
class VacuumRun:
    """A VACUUM running now on a queue table."""

    pid: int
    table: str
    phase: str
    scanned: float | None
    """Share of the table's pages scanned so far."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """Unfinished jobs that wait: pending ones (of types not paused), those due now and
    how long the oldest of them has waited; running jobs whose lease ran out."""

    pending: int
    due: int
    oldest_due_wait: float | None
    expired_leases: int
    oldest_expired: float | None
    """Seconds since the longest-expired lease ran out."""


@dataclass(frozen=True, slots=True)
class StorageHealth:
    """What one database can tell of itself (see :meth:`Database.storage_health`)."""

    findings: Sequence[Finding]
    tables: Sequence[TableHealth] = ()
    indexes: Sequence[IndexHealth] = ()
    horizon: Sequence[HorizonHolder] = ()
    vacuums: Sequence[VacuumRun] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    """Readings without a type of their own (SQLite's WAL size, page counts)."""


@dataclass(frozen=True, slots=True)
class HealthReport:
    """The queue's health at ``checked_at``: ``severity`` is the worst finding's."""

    database: str
    checked_at: datetime
    findings: Sequence[Finding]
    backlog: Backlog
    tables: Sequence[TableHealth] = ()
    indexes: Sequence[IndexHealth] = ()
    horizon: Sequence[HorizonHolder] = ()
    vacuums: Sequence[VacuumRun] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def severity(self) -> Severity:
        return worst(f.severity for f in self.findings)

    def problems(self) -> list[Finding]:
        """The findings that are warnings or critical, the worst first."""
        bad = [f for f in self.findings if f.severity != "ok"]
        return sorted(bad, key=lambda f: -SEVERITIES.index(f.severity))


def worst(severities: Any) -> Severity:
    """The worst of ``severities`` (``"ok"`` for none)."""
    return max(severities, key=SEVERITIES.index, default="ok")


def duration(seconds: float) -> str:
    """``"3d 4h"``, ``"2h 5m"``, ``"4m 10s"``, ``"12s"``: two units at most."""
    left = int(seconds)
    parts: list[str] = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def size(n: int) -> str:
    """Bytes as ``"512 kB"``, ``"12 MB"``, ``"3.1 GB"``."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"


def _latest(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None
