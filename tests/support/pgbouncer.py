"""A PgBouncer of a test's own, in transaction pooling mode, in front of the test Postgres.

Started on a free loopback port from a config in a temp dir (trust auth, as the test
Postgres has), stopped afterwards. :meth:`Bouncer.server_connections` reads its admin
console (``SHOW POOLS``) for how many server connections it holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.support.services import free_port, wait_for_port


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
        wait_for_port(port)
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
