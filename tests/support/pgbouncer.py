"""A PgBouncer of a test's own, in transaction pooling mode, in front of the test Postgres.

Started on a free loopback port from a config in a temp dir (trust auth, as the test
Postgres has), stopped afterwards. :meth:`Bouncer.server_connections` reads its admin
console (``SHOW POOLS``) for how many server connections it holds; :func:`worker_fleet`
runs worker processes through it (the test's and the benchmark's fleet).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Table
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.e2e_app import effects_table
from tests.support.queue_helpers import drop_tables
from tests.support.redis_helpers import delete_prefix
from tests.support.services import free_port, wait_for_port
from tests.support.worker_processes import WorkerProcesses

POOLER_SETTINGS: dict[str, dict[str, Any]] = {
    "psycopg": {"prepare_threshold": None},
    "asyncpg": {"statement_cache_size": 0, "prepared_statement_cache_size": 0},
}
"""The engine settings docs/databases.md gives for PgBouncer, per driver."""


@dataclass
class Bouncer:
    """A running PgBouncer: ``url(driver)`` is the test database through it."""

    port: int
    database: str
    user: str
    process: subprocess.Popen[bytes]

    def url(self, driver: str) -> str:
        return f"postgresql+{driver}://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def server_connections(self) -> int:
        """Server connections PgBouncer holds for the test database now (active, idle,
        used, tested and logging in), from ``SHOW POOLS`` on its admin console."""
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={self.user}",
            autocommit=True,
            prepare_threshold=None,
        ) as admin:
            cursor = admin.execute("SHOW POOLS")
            names = [column.name for column in cursor.description or ()]
            total = 0
            for row in cursor.fetchall():
                pool = dict(zip(names, row, strict=True))
                if pool["database"] == self.database:
                    total += sum(
                        int(pool[key])
                        for key in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
                    )
            return total


@contextmanager
def own_pgbouncer(postgres_url: str, *, pool_size: int = 10) -> Iterator[Bouncer]:
    """PgBouncer (``pool_mode = transaction``, ``default_pool_size = pool_size``) in front
    of the Postgres of ``postgres_url``, in a temp dir of its own (removed after);
    skipped when it is not installed (failed under ``CI=true``)."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    target = make_url(postgres_url)
    user = target.username or "postgres"
    database = target.database or "postgres"
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"""[databases]
{database} = host={target.host or "127.0.0.1"} port={target.port or 5432} dbname={database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
"""
    )
    argv = [binary]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        # (mkdtemp's dir sits in /tmp, which that user can reach; pytest's is root's.)
        shutil.chown(workdir, "postgres")
        for name in ("userlist.txt", "pgbouncer.ini"):
            shutil.chown(workdir / name, "postgres")
        argv += ["-u", "postgres"]
    log = (workdir / "stdout.log").open("ab")
    process = subprocess.Popen(
        [*argv, str(workdir / "pgbouncer.ini")], cwd=workdir, stdout=log, stderr=log
    )
    try:
        wait_for_port(port, process)
        yield Bouncer(port, database, user, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Fleet:
    """Worker processes of ``tests.support.e2e_app`` running through a PgBouncer: the
    producer's ``state`` (through it too), the ``effects`` table their handlers write,
    and the most server connections PgBouncer held so far (sampled every 50 ms)."""

    state: SqlAlchemyStateAdapter
    effects: Table
    workers: WorkerProcesses
    most: int = 0


@asynccontextmanager
async def worker_fleet(
    bouncer: Bouncer,
    driver: str,
    direct: AsyncEngine,
    *,
    redis_url: str,
    prefix: str,
    processes: int,
    concurrency: int,
    log_dir: Path,
) -> AsyncIterator[Fleet]:
    """``processes`` worker processes of ``concurrency`` slots each, on ``driver`` with
    :data:`POOLER_SETTINGS` through ``bouncer``, on tables and Redis keys under
    ``prefix``; on exit the workers are killed and their tables (dropped over
    ``direct``, the database without PgBouncer) and keys removed."""
    table_prefix = f"{prefix}_"
    url = bouncer.url(driver)
    engine = create_async_engine(url, connect_args=POOLER_SETTINGS[driver])
    state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
    await state.migrate()
    effects = effects_table(table_prefix)
    async with direct.begin() as conn:
        await conn.run_sync(effects.create)
    workers = WorkerProcesses(
        {
            "QT_DATABASE_URL": url,
            "QT_TABLE_PREFIX": table_prefix,
            "QT_REDIS_URL": redis_url,
            "QT_REDIS_PREFIX": prefix,
            "QT_CONNECT_ARGS": json.dumps(POOLER_SETTINGS[driver]),
            "QT_CONCURRENCY": str(concurrency),
        },
        log_dir,
    )
    fleet = Fleet(state, effects, workers)
    sampling = True

    async def sample() -> None:
        while sampling:
            fleet.most = max(fleet.most, await asyncio.to_thread(bouncer.server_connections))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        for n in range(processes):
            workers.start(f"w{n}")
        yield fleet
    finally:
        sampling = False
        await sampler
        workers.kill_all()
        await drop_tables(direct, table_prefix)
        await engine.dispose()
        await delete_prefix(redis_url, prefix)
