"""Issue #14: ``SyncClient.start_chain`` next to the bare driver, one chain per
transaction, in the same alternating rounds.

- ``SyncClient, caller tx``: ``with Session(engine) as s, s.begin():
  client.start_chain(..., session=s)``, as a Flask view would;
- ``SyncClient, own tx``: ``client.start_chain(...)`` without a session;
- ``bare driver``: one-row INSERT between BEGIN and COMMIT into a plain table with a
  primary key and one index, no queue code (sync psycopg on Postgres, the sqlite3
  module on SQLite): the floor of this machine at that moment.

No notify adapter (``notify=None``): the figure is the database path; the Redis publish
runs on the client's sender thread after COMMIT, off the caller's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from benchmarks import runner, services, stacks
from queuert_notify.client.sync_client import SyncClient

NAME = "sync-start"
HELP = "SyncClient.start_chain per transaction next to the bare sync driver"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds")
    parser.add_argument("--chains", type=int, default=1000, help="chains per round and way")
    parser.add_argument(
        "--state", default="postgres,sqlite", help="comma-separated: postgres, sqlite"
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())


def _rate(count: int, start: Callable[[int], object]) -> float:
    began = time.perf_counter()
    for index in range(count):
        start(index)
    return count / (time.perf_counter() - began)


def _sync_url(state: str, args: argparse.Namespace, folder: Path) -> str:
    if state == "postgres":
        return str(make_url(args.postgres_url).set(drivername="postgresql+psycopg"))
    return f"sqlite:///{folder}/sync-start.db"


def _client_variant(state: str, args: argparse.Namespace, folder: Path) -> runner.Variant:
    async def one_round() -> runner.Figures:
        prefix = f"{services.unique_prefix()}_"
        engine = create_engine(_sync_url(state, args, folder))
        client = SyncClient(engine, table_prefix=prefix)
        client.migrate()

        def caller(index: int) -> None:
            with Session(engine) as session, session.begin():
                client.start_chain("bench-start", {"n": index}, session=session)

        def own(index: int) -> None:
            client.start_chain("bench-start", {"n": index})

        try:
            return {
                "caller tx chains/s": _rate(args.chains, caller),
                "own tx chains/s": _rate(args.chains, own),
            }
        finally:
            client.close()
            with engine.begin() as conn:
                stacks.drop_prefixed(conn, prefix)
            engine.dispose()

    return runner.Variant(f"{state}, SyncClient", one_round)


def _floor_variant(state: str, args: argparse.Namespace, folder: Path) -> runner.Variant:
    async def one_round() -> runner.Figures:
        table = f"{services.unique_prefix()}_floor"
        ids = itertools.count()
        create = (
            f"CREATE TABLE {table} (id text PRIMARY KEY, type_name text NOT NULL, "
            "input text, created_at text NOT NULL)"
        )
        if state == "postgres":
            import psycopg

            conninfo = make_url(args.postgres_url).set(drivername="postgresql")
            conn = psycopg.connect(conninfo.render_as_string(False), autocommit=True)
            insert = f"INSERT INTO {table} VALUES (%s, %s, %s, now()::text)"
        else:
            conn = sqlite3.connect(folder / "floor.db", isolation_level=None)  # type: ignore[assignment]
            conn.execute("PRAGMA journal_mode = WAL")
            insert = f"INSERT INTO {table} VALUES (?, ?, ?, datetime('now'))"
        try:
            conn.execute(create)
            conn.execute(f"CREATE INDEX {table}_type ON {table} (type_name, created_at)")

            def one(index: int) -> None:
                conn.execute("BEGIN")
                conn.execute(insert, (f"r{next(ids)}", "bench-start", json.dumps({"n": index})))
                conn.execute("COMMIT")

            rate = _rate(args.chains, one)
            conn.execute(f"DROP TABLE {table}")
        finally:
            conn.close()
        return {"caller tx chains/s": rate, "own tx chains/s": rate}

    return runner.Variant(f"{state}, bare driver (floor)", one_round)


async def run(args: argparse.Namespace) -> str:
    states = [s.strip() for s in args.state.split(",") if s.strip()]
    folder = Path(tempfile.mkdtemp())
    variants = []
    for state in states:
        variants += [_client_variant(state, args, folder), _floor_variant(state, args, folder)]
    results = await runner.alternate(variants, args.rounds)
    rows = results.all_medians()
    for state in states:
        ratio = results.ratio(f"{state}, SyncClient", f"{state}, bare driver (floor)")
        rows[f"{state}: SyncClient / floor"] = ratio
    return runner.report(
        "Sync start (SyncClient)",
        [
            f"Medians of {args.rounds} alternating rounds of {args.chains:,} chains, one per "
            "transaction, one thread (the floor has one column; it is shown under both):",
            runner.table(rows, first_column="state"),
        ],
        notes=[runner.machine_notes()],
    )
