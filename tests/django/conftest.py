"""One real Django project for the module's tests: written to a temp dir, migrated
(``makemigrations`` + ``migrate`` on both databases), set up in this process, on a
Postgres database of its own (dropped afterwards) and a SQLite file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("django")

import psycopg

from tests.django.project import manage, write_project


@dataclass
class Project:
    root: Path
    env: dict[str, str]
    prefix: str
    workers: list[subprocess.Popen[str]] = field(default_factory=list)

    def start_worker(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``manage.py queuert_worker ARGS`` (60 s poll, ``env`` added to the project's),
        once it says it runs."""
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "queuert_worker", "--poll-interval=60", *args],
            cwd=self.root,
            env={**os.environ, **self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.workers.append(worker)
        assert worker.stdout is not None
        seen = []
        for line in worker.stdout:
            seen.append(line)
            if line.startswith("worker "):
                break
        else:
            raise AssertionError("the worker exited:\n" + "".join(seen))
        return worker

    def stop_worker(self, worker: subprocess.Popen[str]) -> str:
        """SIGTERM (a graceful drain); the worker's output. It must exit 0."""
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
        self.workers.remove(worker)
        assert worker.returncode == 0, output
        return output


@pytest.fixture(scope="session")
def django_project(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_url: str
) -> Iterator[Project]:
    import django
    from sqlalchemy.engine import make_url

    root = tmp_path_factory.mktemp("djangoproject")
    write_project(root)
    name = f"qn_django_{uuid.uuid4().hex[:10]}"
    server = make_url(postgres_url).set(drivername="postgresql")
    admin = server.render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    prefix = f"qt{uuid.uuid4().hex[:12]}"
    env = {
        "QN_PG_NAME": name,
        "QN_SQLITE_PATH": str(root / "lite.sqlite3"),
        "QN_REDIS_URL": redis_url,
        "QN_PREFIX": prefix,
        "DJANGO_SETTINGS_MODULE": "proj.settings",
    }
    project = Project(root, env, prefix)
    saved = dict(os.environ)
    try:
        manage(root, env, "makemigrations", "shop")
        manage(root, env, "migrate")
        manage(root, env, "migrate", "--database=lite")
        os.environ.update(env)
        sys.path.insert(0, str(root))
        django.setup()
        yield project
    finally:
        for worker in project.workers:
            worker.kill()
            worker.wait()
        from django.apps import apps

        if apps.ready:
            from django.db import connections

            connections.close_all()
        os.environ.clear()
        os.environ.update(saved)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
