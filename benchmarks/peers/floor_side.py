"""The floor of ``python -m benchmarks peers``: the same enqueue workloads with no
queue code (runs in the product's virtualenv, as
``python -m benchmarks.peers.floor_side``).

``--kind psycopg``: one-row INSERTs between ``BEGIN`` and ``COMMIT`` on one
psycopg 3 connection (and 100-row ``executemany`` transactions) into a table
with a primary key and one index, like a job table's least. ``--kind sqlite3``:
the same through the standard library's ``sqlite3`` on a WAL file with
``synchronous=NORMAL`` (queuert-notify's default), each transaction begun
with ``BEGIN IMMEDIATE``, called directly on the event loop's thread.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.peers import workloads

_CREATE = (
    "CREATE TABLE floor_jobs (id text PRIMARY KEY, type_name text NOT NULL, "
    "input text, created_at {timestamp} NOT NULL)"
)
_INDEX = "CREATE INDEX floor_jobs_type_ix ON floor_jobs (type_name, created_at)"


class FloorSide:
    def __init__(self, args: argparse.Namespace) -> None:
        self.kind = args.kind
        self.dsn = args.dsn
        self.ids = itertools.count()
        self.psycopg: psycopg.AsyncConnection[Any] | None = None
        self.sqlite: sqlite3.Connection | None = None
        self.workdir = ""

    def _row(self) -> tuple[str, str, str]:
        return (f"r{next(self.ids)}", "bench-noop", "null")

    async def setup(self) -> None:
        if self.kind == "psycopg":
            self.psycopg = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            await self.psycopg.execute(_CREATE.format(timestamp="timestamptz"))
            await self.psycopg.execute(_INDEX)
            return
        self.workdir = tempfile.mkdtemp(prefix="queuert-floor-")
        self.sqlite = sqlite3.connect(f"{self.workdir}/floor.db", isolation_level=None)
        self.sqlite.execute("PRAGMA journal_mode=WAL")
        self.sqlite.execute("PRAGMA synchronous=NORMAL")
        self.sqlite.execute(_CREATE.format(timestamp="text"))
        self.sqlite.execute(_INDEX)

    async def close(self) -> None:
        if self.psycopg is not None:
            await self.psycopg.close()
        if self.sqlite is not None:
            self.sqlite.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def enqueue(self) -> None:
        await self.enqueue_batch(1)

    async def enqueue_batch(self, jobs: int) -> None:
        rows = [self._row() for _ in range(jobs)]
        if self.psycopg is not None:
            insert = "INSERT INTO floor_jobs VALUES (%s, %s, %s, now())"
            async with self.psycopg.transaction(), self.psycopg.cursor() as cursor:
                if jobs == 1:
                    await cursor.execute(insert, rows[0])
                else:
                    await cursor.executemany(insert, rows)
            return
        assert self.sqlite is not None
        insert = "INSERT INTO floor_jobs VALUES (?, ?, ?, datetime('now'))"
        self.sqlite.execute("BEGIN IMMEDIATE")
        self.sqlite.executemany(insert, rows)
        self.sqlite.execute("COMMIT")

    async def fill(self, jobs: int) -> None:
        raise NotImplementedError("the floor has no worker")

    async def drain(self, jobs: int, concurrency: int) -> float:
        raise NotImplementedError("the floor has no worker")

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        raise NotImplementedError("the floor has no worker")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=("psycopg", "sqlite3"), default="psycopg")


if __name__ == "__main__":
    workloads.main(FloorSide, __doc__ or "", _arguments)
