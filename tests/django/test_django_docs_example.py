"""docs/django.md's example project, written and run exactly as the page shows it:
its files, its commands (makemigrations, migrate, queuert_worker), its shell session,
and its ``asgi.py`` with the dashboard mounted, served by the page's uvicorn command."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.support.services import free_port

DOC = Path(__file__).parents[2] / "docs" / "django.md"
BLOCK = re.compile(r'```(\w*)(?: title="([^"]+)")?\n(.*?)```', re.DOTALL)

# The Django project (session scope, tests/django/conftest.py: a database, migrations,
# django.setup()) is built once: one xdist worker runs every Django test.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("django")]


def blocks() -> tuple[dict[str, str], list[list[str]]]:
    """The titled code blocks (file name -> text) and each bash block's commands."""
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for language, title, text in BLOCK.findall(DOC.read_text()):
        if title:
            files[title] = text
        elif language == "bash":
            commands.append([line for line in text.splitlines() if line.strip()])
    return files, commands


def test_the_example_project_runs_as_written(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    files, (commands, serve) = blocks()
    shell = files.pop("shell")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for package in ("mysite", "accounts", "accounts/migrations"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    database = f"qn_django_doc_{uuid.uuid4().hex[:10]}"
    admin = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    env = {
        **os.environ,
        "MYSITE_DB": database,
        "REDIS_URL": redis_url,
        "QUEUERT_REDIS_PREFIX": f"qt{uuid.uuid4().hex[:12]}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    worker: subprocess.Popen[str] | None = None
    try:
        assert [c.split()[:3] for c in commands] == [
            ["python", "manage.py", "makemigrations"],
            ["python", "manage.py", "migrate"],
            ["python", "manage.py", "queuert_worker"],
        ]
        for command in commands[:2]:
            argv = [sys.executable, *shlex.split(command)[1:]]
            done = subprocess.run(
                argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stdout + done.stderr
        worker = subprocess.Popen(
            [sys.executable, *shlex.split(commands[2])[1:]],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        done = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", shell],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESSFUL welcomed ada@example.com" in done.stdout
        check_the_mounted_dashboard(tmp_path, env, serve)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            output, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0, output
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def check_the_mounted_dashboard(root: Path, env: dict[str, str], serve: list[str]) -> None:
    """``TOKEN=... uvicorn mysite.asgi:application`` as the page has it (on a free port):
    the dashboard answers under /queue with the token and 401 without."""
    pytest.importorskip("uvicorn")
    import httpx

    (command,) = serve
    assignment, *argv = shlex.split(command)
    name, token = assignment.split("=", 1)
    assert argv == ["uvicorn", "mysite.asgi:application"]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", *argv, f"--port={port}"],
        cwd=root,
        env={**env, name: token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if "Uvicorn running" in line:
                break
        base = f"http://127.0.0.1:{port}/queue/"
        assert httpx.get(base, timeout=30).status_code == 401
        page = httpx.get(base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert page.status_code == 200
        assert "django:default" in page.text
    finally:
        server.terminate()
        server.communicate(timeout=30)
