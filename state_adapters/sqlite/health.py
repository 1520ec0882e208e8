"""What SQLite tells of the queue's health: the WAL file's size (a reader that never
ends keeps checkpoints from resetting it, SQLite's form of a held horizon), and the
database's pages and free pages. SQLite keeps no dead row versions, no statistics of
its own and no record of the last checkpoint; the report says so rather than guess.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text

from state_adapters.health import Finding, HealthThresholds, StorageHealth, size

NOT_AVAILABLE = (
    "last checkpoint, dead rows and the transactions holding readers: not kept by SQLite"
)


async def read(conn: Any, limits: HealthThresholds) -> StorageHealth:
    """Four pragmas and a stat of the WAL file."""
    page_size = int((await conn.execute(text("PRAGMA page_size"))).scalar_one())
    pages = int((await conn.execute(text("PRAGMA page_count"))).scalar_one())
    free = int((await conn.execute(text("PRAGMA freelist_count"))).scalar_one())
    journal = str((await conn.execute(text("PRAGMA journal_mode"))).scalar_one())
    files = {row[1]: row[2] for row in await conn.execute(text("PRAGMA database_list"))}
    path = files.get("main") or ""
    wal_bytes = _wal_bytes(path)
    facts = {
        "path": path or None,
        "journal_mode": journal,
        "page_size": page_size,
        "pages": pages,
        "free_pages": free,
        "database_bytes": pages * page_size,
        "wal_bytes": wal_bytes,
        "not_available": NOT_AVAILABLE,
    }
    findings: list[Finding] = []
    if journal.lower() != "wal":
        findings.append(
            Finding(
                "warning",
                "journal",
                f"journal_mode is {journal}, not wal",
                "readers and the writer block each other; claims wait behind every read",
                "open the database through the queue's adapter (it sets WAL), or run "
                "PRAGMA journal_mode=WAL once",
            )
        )
    if wal_bytes >= limits.sqlite_wal_bytes:
        findings.append(
            Finding(
                "warning",
                "wal",
                f"the WAL file is {size(wal_bytes)}",
                "checkpoints cannot reset it, usually because a read transaction never "
                "ends; every read walks a longer WAL",
                "end long-lived read transactions in the application, then "
                "PRAGMA wal_checkpoint(TRUNCATE)",
            )
        )
    if not findings:
        findings.append(
            Finding(
                "ok",
                "storage",
                f"{size(pages * page_size)} in pages ({free} free), WAL {size(wal_bytes)}",
                "checkpoints keep up",
                "nothing (VACUUM returns free pages to the file system, if wanted)",
            )
        )
    return StorageHealth(findings=findings, facts=facts)


def _wal_bytes(path: str) -> int:
    """The size of ``path``'s WAL file (0 when there is none). A stat of a local file
    takes microseconds; the sync client's calls may await nothing but their
    connection, so it is not sent to a thread."""
    try:
        return os.stat(path + "-wal").st_size if path else 0
    except FileNotFoundError:
        return 0
