"""What Postgres tells of the queue's health: its tables' live and dead row versions,
sizes, and last (auto)vacuum and (auto)analyze (the statistics behind
``pg_stat_user_tables``, index sizes);
the transactions, prepared transactions and replication slots that hold back the xmin
horizon (``pg_stat_activity``, ``pg_prepared_xacts``, ``pg_replication_slots``), so
vacuum cannot remove what claims and completions leave behind; and the vacuums running
now (``pg_stat_progress_vacuum``).

The statements read the server's own views, not the queue's tables (so they are SQL
text, not Core), and each reads a handful of rows: their cost does not grow with the
jobs. A backend's query is read as text, cut, and its string literals blanked;
nothing reads statement parameters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, TEXT

from state_adapters.health import (
    Finding,
    HealthThresholds,
    HorizonHolder,
    IndexHealth,
    Severity,
    StorageHealth,
    TableHealth,
    VacuumRun,
    duration,
    size,
)
from state_adapters.schema import Tables

QUERY_CHARS = 80
"""How much of a backend's statement a horizon finding shows."""
_HOLDERS_SHOWN = 5

# The statistics functions, not the pg_stat_user_tables view: the view aggregates
# over every table's indexes to answer for a few.
_TABLES = """
SELECT c.relname AS name, pg_stat_get_live_tuples(c.oid) AS live,
       pg_stat_get_dead_tuples(c.oid) AS dead, pg_stat_get_mod_since_analyze(c.oid) AS modified,
       pg_stat_get_last_vacuum_time(c.oid) AS vacuum,
       pg_stat_get_last_autovacuum_time(c.oid) AS autovacuum,
       pg_stat_get_last_analyze_time(c.oid) AS analyze,
       pg_stat_get_last_autoanalyze_time(c.oid) AS autoanalyze,
       pg_table_size(c.oid) AS heap, pg_indexes_size(c.oid) AS indexes,
       coalesce(c.reloptions, '{}') AS options
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = coalesce(CAST(:schema AS text), current_schema())
  AND c.relname = ANY(:names) AND c.relkind IN ('r', 'p')
"""

_INDEXES = """
SELECT i.relname AS name, t.relname AS of_table, pg_relation_size(i.oid) AS size,
       i.reltuples AS entries
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = coalesce(CAST(:schema AS text), current_schema()) AND t.relname = ANY(:names)
"""

# Client backends of this database holding a snapshot (backend_xmin) or a transaction
# id (backend_xid), oldest first; autovacuum's own are left out (other vacuums ignore
# them), and so is this one.
_TRANSACTIONS = f"""
SELECT pid, application_name AS application, state,
       extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age,
       greatest(age(backend_xmin), age(backend_xid)) AS xid_age, left(query, 1000) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND datname = current_database()
  AND backend_type = 'client backend'
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND xact_start < clock_timestamp() - make_interval(secs => :age)
ORDER BY xact_start
LIMIT {_HOLDERS_SHOWN}
"""

_PREPARED = f"""
SELECT gid, owner, extract(epoch FROM clock_timestamp() - prepared)::float8 AS age,
       age(transaction) AS xid_age
FROM pg_prepared_xacts
WHERE database = current_database()
  AND prepared < clock_timestamp() - make_interval(secs => :age)
ORDER BY prepared
LIMIT {_HOLDERS_SHOWN}
"""

# A slot's xmin holds back every database's horizon (a physical slot of a standby with
# hot_standby_feedback); a logical slot's catalog_xmin holds only the catalogs.
_SLOTS = f"""
SELECT slot_name AS name, slot_type AS type, active, active_pid AS pid, age(xmin) AS xid_age
FROM pg_replication_slots
WHERE xmin IS NOT NULL
ORDER BY age(xmin) DESC
LIMIT {_HOLDERS_SHOWN}
"""

_VACUUMS = """
SELECT p.pid, c.relname AS of_table, p.phase,
       CASE WHEN p.heap_blks_total > 0
            THEN p.heap_blks_scanned::float8 / p.heap_blks_total END AS scanned
FROM pg_stat_progress_vacuum p
JOIN pg_class c ON c.oid = p.relid
WHERE p.datname = current_database() AND c.relname = ANY(:names)
"""

_PARTS = {
    "tables": _TABLES,
    "indexes": _INDEXES,
    "transactions": _TRANSACTIONS,
    "prepared": _PREPARED,
    "slots": _SLOTS,
    "vacuums": _VACUUMS,
}
# All of them in one round trip, each as a JSON array of objects (keys in column order).
_READINGS = text(
    "SELECT current_setting('autovacuum') AS autovacuum,\n"
    + ",\n".join(
        f"(SELECT coalesce(json_agg(r), '[]') FROM ({sql}) AS r) AS {name}"
        for name, sql in _PARTS.items()
    )
).bindparams(bindparam("names", type_=ARRAY(TEXT)))

_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'?")
_SPACES = re.compile(r"\s+")


def queue_table_names(tables: Tables) -> list[str]:
    return [t.name for t in tables.metadata.sorted_tables]


async def read(conn: Any, tables: Tables, limits: HealthThresholds) -> StorageHealth:
    """The readings and their findings, in one read of the server's views."""
    params = {
        "names": queue_table_names(tables),
        "schema": tables.schema,
        "age": limits.horizon_age,
    }
    readings = (await conn.execute(_READINGS, params)).mappings().one()
    holders = [
        *(_transaction(_values(row)) for row in readings["transactions"]),
        *(_prepared(_values(row)) for row in readings["prepared"]),
    ]
    slots = [_slot(_values(row)) for row in readings["slots"]]
    vacuums = [VacuumRun(*_values(row)) for row in readings["vacuums"]]
    table_health = sorted(
        (_table(_values(row)) for row in readings["tables"]), key=lambda t: t.name
    )
    indexes = sorted(
        (
            IndexHealth(name, table, int(nbytes), None if entries < 0 else int(entries))
            for name, table, nbytes, entries in map(_values, readings["indexes"])
        ),
        key=lambda i: (i.table, i.name),
    )
    held_slots = [(s, active) for s, active in slots if not active or _slot_too_old(s, limits)]
    horizon = [*holders, *(s for s, _ in held_slots)]
    findings = [
        *horizon_findings(holders, held_slots, limits),
        *table_findings(table_health, horizon, limits, autovacuum=readings["autovacuum"] == "on"),
        *index_findings(indexes, limits),
    ]
    return StorageHealth(
        findings=findings,
        tables=table_health,
        indexes=indexes,
        horizon=horizon,
        vacuums=vacuums,
        facts={"autovacuum": readings["autovacuum"]},
    )


def horizon_findings(
    holders: Sequence[HorizonHolder],
    slots: Sequence[tuple[HorizonHolder, bool]],
    limits: HealthThresholds,
) -> list[Finding]:
    """One finding per holder older than ``horizon_age``, or one that says none is."""
    meaning = (
        "vacuum cannot remove row versions deleted after it began: the queue's dead rows "
        "and index entries pile up, and every claim steps over more of them"
    )
    findings: list[Finding] = []
    for holder in holders:
        age = holder.age_seconds or 0.0
        severity: Severity = "critical" if age >= limits.horizon_critical_age else "warning"
        if holder.kind == "transaction":
            who = holder.application_name or "no application_name"
            summary = (
                f"backend {holder.pid} ({who}, {holder.state}) has held a transaction open for "
                f"{duration(age)}, {holder.xid_age} transactions behind: {holder.query!r}"
            )
            action = (
                f"end it (SELECT pg_terminate_backend({holder.pid})) and fix the code that "
                "keeps it open; set idle_in_transaction_session_timeout"
            )
        else:
            summary = f"prepared transaction {holder.name!r} has waited {duration(age)}"
            action = (
                f"COMMIT PREPARED or ROLLBACK PREPARED {holder.name!r} (it survives restarts "
                "until one of them runs)"
            )
        findings.append(Finding(severity, "xmin horizon", summary, meaning, action))
    for slot, active in slots:
        findings.append(
            Finding(
                "warning" if active else "critical",
                "xmin horizon",
                f"replication slot {slot.name!r} ({'active' if active else 'inactive'}) holds "
                f"the horizon {slot.xid_age} transactions back",
                meaning,
                f"if its consumer is gone, SELECT pg_drop_replication_slot({slot.name!r}); "
                "otherwise find why the standby or consumer lags",
            )
        )
    if not findings:
        findings.append(
            Finding(
                "ok",
                "xmin horizon",
                f"no transaction older than {duration(limits.horizon_age)}, prepared "
                "transaction or replication slot holds it back",
                "vacuum can remove what claims and completions leave behind",
                "nothing",
            )
        )
    return findings


def table_findings(
    tables: Sequence[TableHealth],
    horizon: Sequence[HorizonHolder],
    limits: HealthThresholds,
    *,
    autovacuum: bool = True,
) -> list[Finding]:
    """Dead row versions and stale statistics per queue table; ``autovacuum``: whether
    the server's autovacuum is on."""
    findings: list[Finding] = []
    for table in tables:
        subject = f"table {table.name}"
        if table.dead_rows >= limits.dead_rows and table.dead_ratio >= limits.dead_ratio:
            vacuumed = table.vacuumed_at
            when = "never" if vacuumed is None else vacuumed.strftime("%Y-%m-%d %H:%M:%S UTC")
            if horizon:
                action = (
                    f"vacuum cannot remove them while {_named(horizon[0])} holds the horizon: "
                    f"end it, then VACUUM {table.name}"
                )
            elif not autovacuum or "autovacuum_enabled=false" in table.settings:
                action = (
                    f"autovacuum is off (the server's autovacuum setting or the table's "
                    f"autovacuum_enabled): VACUUM {table.name} now, and turn it on"
                )
            else:
                action = (
                    f"autovacuum is behind: VACUUM (VERBOSE) {table.name}, and check its "
                    "autovacuum settings (docs/operations.md, Health)"
                )
            findings.append(
                Finding(
                    "critical" if table.dead_ratio >= limits.dead_ratio_critical else "warning",
                    subject,
                    f"{table.dead_rows} dead row versions, {table.dead_ratio:.0%} of the table "
                    f"({table.live_rows} live); last vacuum: {when}",
                    "claims and index scans step over dead versions: each claim costs more "
                    "as they grow",
                    action,
                )
            )
        if table.modified_since_analyze >= max(limits.stale_rows, table.live_rows):
            findings.append(
                Finding(
                    "warning",
                    subject,
                    f"{table.modified_since_analyze} rows changed since the last ANALYZE "
                    f"({table.live_rows} live)",
                    "the planner's row estimates are stale; reads other than the claim may "
                    "pick slow plans",
                    f"ANALYZE {table.name}, and check that autovacuum runs on it",
                )
            )
    if not findings and tables:
        worst_table = max(tables, key=lambda t: t.dead_ratio)
        findings.append(
            Finding(
                "ok",
                "queue tables",
                f"dead row versions at most {worst_table.dead_ratio:.0%} "
                f"({worst_table.name}); statistics fresh",
                "vacuum keeps up",
                "nothing",
            )
        )
    return findings


def index_findings(indexes: Sequence[IndexHealth], limits: HealthThresholds) -> list[Finding]:
    """Indexes far larger than their entries need: bloated by dead entries."""
    findings: list[Finding] = []
    for index in indexes:
        if index.bytes < limits.index_min_bytes or index.entries is None:
            continue
        per_entry = index.bytes / max(index.entries, 1)
        if per_entry >= limits.index_bytes_per_entry:
            findings.append(
                Finding(
                    "warning",
                    f"index {index.name}",
                    f"{size(index.bytes)} for {index.entries} entries ({per_entry:.0f} bytes each)",
                    "scans of it read pages of dead entries; claims or reads on it slow down",
                    f"REINDEX INDEX CONCURRENTLY {index.name} (once no old transaction "
                    "holds the horizon, or it bloats again)",
                )
            )
    return findings


def redact(query: str | None) -> str | None:
    """``query`` on one line with its string literals blanked, cut to
    :data:`QUERY_CHARS` characters."""
    if query is None:
        return None
    flat = _SPACES.sub(" ", _STRING_LITERAL.sub("'?'", query)).strip()
    return flat if len(flat) <= QUERY_CHARS else flat[: QUERY_CHARS - 1] + "…"


def _values(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.values())


def _instant(value: str | None) -> datetime | None:
    """A timestamptz as JSON renders it (ISO 8601 with an offset)."""
    return None if value is None else datetime.fromisoformat(value)


def _table(row: Any) -> TableHealth:
    name, live, dead, modified, vacuum, autovacuum, analyze, autoanalyze, heap, index, options = row
    return TableHealth(
        name=name,
        live_rows=int(live),
        dead_rows=int(dead),
        modified_since_analyze=int(modified),
        last_vacuum=_instant(vacuum),
        last_autovacuum=_instant(autovacuum),
        last_analyze=_instant(analyze),
        last_autoanalyze=_instant(autoanalyze),
        table_bytes=int(heap),
        index_bytes=int(index),
        settings=tuple(options),
    )


def _transaction(row: Any) -> HorizonHolder:
    pid, application_name, state, age, xid_age, query = row
    return HorizonHolder(
        kind="transaction",
        name=str(pid),
        age_seconds=float(age),
        xid_age=None if xid_age is None else int(xid_age),
        pid=int(pid),
        application_name=application_name or None,
        state=state,
        query=redact(query),
    )


def _prepared(row: Any) -> HorizonHolder:
    gid, owner, age, xid_age = row
    return HorizonHolder(
        kind="prepared transaction",
        name=gid,
        age_seconds=float(age),
        xid_age=int(xid_age),
        application_name=owner,
    )


def _slot(row: Any) -> tuple[HorizonHolder, bool]:
    name, slot_type, active, active_pid, xid_age = row
    holder = HorizonHolder(
        kind="replication slot",
        name=name,
        age_seconds=None,
        xid_age=int(xid_age),
        pid=active_pid,
        state=f"{slot_type}, {'active' if active else 'inactive'}",
    )
    return holder, bool(active)


def _named(holder: HorizonHolder) -> str:
    if holder.kind == "transaction":
        return f"backend {holder.pid}"
    return f"{holder.kind} {holder.name!r}"


def _slot_too_old(slot: HorizonHolder, limits: HealthThresholds) -> bool:
    return (slot.xid_age or 0) >= limits.slot_xid_age
