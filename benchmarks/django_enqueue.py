"""Issue #29: ``task.enqueue()`` inside ``transaction.atomic()`` next to a bare
``Model.objects.create()`` of one row in the same transaction.

Every transaction does both, timed separately: ``with transaction.atomic():
Row.objects.create(...); task.enqueue(...)``, every other transaction enqueueing first.
An untimed ``SELECT 1`` opens each transaction, so neither measure carries the BEGIN
that psycopg sends before the transaction's first statement. Redis wakeups on: the
publish goes to the sender thread after COMMIT, but its Python holds the GIL while the
next transaction runs, so it lands in whichever measure runs then. A Postgres database
of the run's own (dropped afterwards) and a SQLite file (WAL, ``BEGIN IMMEDIATE``).
One Postgres row starts the chain with the statement of a batch (a JSON document)
instead of the one-chain ``INSERT ... VALUES``: what the one-chain statement saves.
The psycopg2 row runs Django's Postgres backend on psycopg2, as Django does where
psycopg 3 is not installed: in a process of its own (``benchmarks/django_side.py``)
that cannot import psycopg 3.

With ``--baseline DIR`` (a checkout of another commit) every round runs in two
processes, one per checkout (``benchmarks/django_side.py``), on the same database, the
rounds of the two alternating; the ratios of this tree's figures to the baseline's
pair rounds run back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy.engine import make_url

from benchmarks import runner, services

_ROOT = Path(__file__).resolve().parent.parent


class _Row(NamedTuple):
    alias: str
    """The Django database alias."""
    label: str
    batch_statement: bool
    """Whether the one chain is started with the batch statement."""
    psycopg2: bool = False
    """Whether Django's Postgres backend runs on psycopg2 (in a process of its own)."""


_DATABASES = {
    "postgres": _Row("default", "Postgres (psycopg 3)", False),
    "psycopg2": _Row("default", "Postgres (psycopg2)", False, psycopg2=True),
    "batch": _Row("default", "Postgres (psycopg 3), the batch statement", True),
    "prepared": _Row("prepared", "Postgres, prepared statements", False),
    "sqlite": _Row("lite", "SQLite", False),
}
"""``--databases`` choices."""

NAME = "django-enqueue"
HELP = "task.enqueue() inside atomic() next to Model.objects.create() in the same transaction"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds")
    parser.add_argument("--transactions", type=int, default=1000, help="per round and database")
    parser.add_argument(
        "--databases",
        default=",".join(_DATABASES),
        help=f"comma-separated rows to run: {', '.join(_DATABASES)}",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="a checkout of another commit: every row also runs from it, alternating",
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--redis-url", default=services.redis_url())


def _setup(args: argparse.Namespace, database: str, folder: Path) -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    # The benchmarks' runner drives rounds from a coroutine; the measured code is the
    # synchronous view code it would be, on this one thread.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    extra = [] if sys.version_info >= (3, 12) else ["django_tasks"]
    queue = {
        "redis_url": args.redis_url,
        "redis_prefix": services.unique_prefix(),
        "table_prefix": "queuert_",
    }
    settings.configure(
        INSTALLED_APPS=[*extra, "queuert_notify.contrib.django", "benchmarks.django_app"],
        USE_TZ=True,
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": database,
                "USER": args.pg.username,
                "PASSWORD": args.pg.password or "",
                "HOST": args.pg.host,
                "PORT": str(args.pg.port or 5432),
            },
            # The same database with prepared statements (Django disables them by
            # default, for connection poolers): psycopg prepares the queue's statement
            # and Django's INSERT after five runs.
            "prepared": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": database,
                "USER": args.pg.username,
                "PASSWORD": args.pg.password or "",
                "HOST": args.pg.host,
                "PORT": str(args.pg.port or 5432),
                "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5},
            },
            "lite": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(folder / "bench.sqlite3"),
                "OPTIONS": {
                    "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL",
                },
            },
        },
        TASKS={
            "default": {
                "BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
                "OPTIONS": queue,
            },
            "prepared": {
                "BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
                "OPTIONS": {**queue, "database": "prepared"},
            },
            "lite": {
                "BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
                "OPTIONS": {**queue, "database": "lite"},
            },
        },
    )
    django.setup()
    for alias in ("default", "lite"):
        call_command("migrate", database=alias, run_syncdb=True, verbosity=0)


def _variant(
    alias: str, label: str, transactions: int, *, batch_statement: bool = False
) -> runner.Variant:
    """``batch_statement``: one chain started with the statement of a batch (the JSON
    document), as before the one-chain statement, for a comparison side by side."""

    async def one_round() -> runner.Figures:
        if not batch_statement:
            return _round()
        from state_adapters.postgres.database import Postgres

        one_chain = Postgres.insert_first_jobs
        Postgres.insert_first_jobs = _insert_as_batch  # type: ignore[method-assign]
        try:
            return _round()
        finally:
            Postgres.insert_first_jobs = one_chain  # type: ignore[method-assign]

    def _round() -> runner.Figures:
        from django.db import connections, transaction

        from benchmarks.django_app.models import Row
        from benchmarks.django_app.tasks import make_task

        task: Any = make_task(alias)
        creates: list[float] = []
        enqueues: list[float] = []
        for index in range(transactions):
            with transaction.atomic(using=alias):
                with connections[alias].cursor() as cursor:
                    cursor.execute("SELECT 1")
                if index % 2:
                    began = time.perf_counter()
                    task.enqueue(index)
                    enqueued = time.perf_counter()
                    Row.objects.using(alias).create(name=f"row {index}")
                    created = time.perf_counter()
                    enqueues.append(enqueued - began)
                    creates.append(created - enqueued)
                else:
                    began = time.perf_counter()
                    Row.objects.using(alias).create(name=f"row {index}")
                    created = time.perf_counter()
                    task.enqueue(index)
                    enqueued = time.perf_counter()
                    creates.append(created - began)
                    enqueues.append(enqueued - created)
        create = statistics.median(creates) * 1e6
        enqueue = statistics.median(enqueues) * 1e6
        return {
            "create() µs": create,
            "enqueue() µs": enqueue,
            "enqueue / create": enqueue / create,
        }

    return runner.Variant(label, one_round)


async def _insert_as_batch(self: Any, conn: Any, firsts: Any, now: Any) -> None:
    query = self._own.insert_first_jobs(firsts, now)
    await self.compiled(query.statement).rows(conn, query.params)


async def run(args: argparse.Namespace) -> str:
    import psycopg

    chosen = runner.choices(args.databases, list(_DATABASES), "--databases")
    args.pg = make_url(args.postgres_url)
    admin = args.pg.set(drivername="postgresql").render_as_string(hide_password=False)
    database = f"qbench_django_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    on_psycopg2 = any(_DATABASES[name].psycopg2 for name in chosen)
    sides: list[_Side] = []
    try:
        # One after the other, psycopg 3's first: the first migrates the database the
        # others find ready (the queue's migrations need psycopg 3).
        if args.baseline is None:
            _setup(args, database, Path(tempfile.mkdtemp()))
            if on_psycopg2:
                sides.append(await _Side.start(_ROOT, "", database, args, psycopg2=True))
        else:
            for psycopg2 in (False, True)[: 1 + on_psycopg2]:
                for root, suffix in ((_ROOT, ""), (Path(args.baseline), " [baseline]")):
                    sides.append(await _Side.start(root, suffix, database, args, psycopg2))
        variants = []
        for name in chosen:
            row = _DATABASES[name]
            on_sides = [side for side in sides if side.psycopg2 == row.psycopg2]
            if on_sides:
                variants += [side.variant(name, args.transactions) for side in on_sides]
            else:
                variants.append(
                    _variant(
                        row.alias, row.label, args.transactions, batch_statement=row.batch_statement
                    )
                )
        results = await runner.alternate(variants, args.rounds)
    finally:
        for side in sides:
            await side.stop()
        if args.baseline is None:
            from django.db import connections

            connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    sections = [
        f"Medians over {args.rounds} alternating rounds of {args.transactions:,} "
        "transactions, each opened by an untimed SELECT 1, then doing one create() and "
        "one enqueue() (order alternating), one thread, Redis wakeups on:",
        runner.table(results.all_medians(), first_column="database"),
    ]
    if args.baseline is not None:
        ratios = {
            (label := _DATABASES[name].label): results.ratio(label, f"{label} [baseline]")
            for name in chosen
        }
        sections += [
            f"This tree / the baseline ({args.baseline}), medians of the ratios of rounds "
            "run back to back:",
            runner.table(ratios, first_column="database"),
        ]
    return runner.report(
        "Django: enqueue inside atomic() next to Model.objects.create()",
        sections,
        notes=[
            f"Django {_django_version()}"
            + (f", psycopg2 {metadata.version('psycopg2-binary')}" if on_psycopg2 else ""),
            runner.machine_notes(),
        ],
    )


class _Side:
    """A checkout's rounds, run by ``benchmarks/django_side.py`` in a process of its own."""

    def __init__(
        self, root: Path, suffix: str, psycopg2: bool, process: asyncio.subprocess.Process
    ) -> None:
        self.root = root
        self.suffix = suffix
        """Of its rows' labels."""
        self.psycopg2 = psycopg2
        """Whether its Django runs Postgres on psycopg2 (psycopg 3 hidden from it)."""
        self._process = process

    @classmethod
    async def start(
        cls, root: Path, suffix: str, database: str, args: argparse.Namespace, psycopg2: bool
    ) -> _Side:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(_ROOT / "benchmarks" / "django_side.py"),
            database,
            args.redis_url,
            args.postgres_url,
            *(["psycopg2"] if psycopg2 else []),
            cwd=root,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        side = cls(root, suffix, psycopg2, process)
        if await side._reply() != "ready":
            raise SystemExit(f"django-enqueue: the side in {root} did not start")
        return side

    def variant(self, name: str, transactions: int) -> runner.Variant:
        row = _DATABASES[name]
        request = {
            "alias": row.alias,
            "batch_statement": row.batch_statement,
            "transactions": transactions,
        }

        async def one_round() -> runner.Figures:
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            figures: runner.Figures = json.loads(await self._reply())
            return figures

        return runner.Variant(_DATABASES[name].label + self.suffix, one_round)

    async def _reply(self) -> str:
        assert self._process.stdout is not None
        line = await self._process.stdout.readline()
        if not line:
            raise SystemExit(f"django-enqueue: the side in {self.root} exited")
        return line.decode().strip()

    async def stop(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        await self._process.wait()


def _django_version() -> str:
    import django

    return django.get_version()
