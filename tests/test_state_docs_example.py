"""The runnable examples do what their pages say: docs/transactional-enqueue.md's,
docs/sync-apps.md's WSGI app,
README.md's (as written, with no server), and docs/testing.md's tests, which pass on
SQLite + in-process notify and unchanged on Postgres + Redis."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text as sql
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

REPO = Path(__file__).resolve().parent.parent
TESTING_EXAMPLE = REPO / "docs" / "examples" / "testing"


async def _run(*args: str | Path, cwd: Path, **env: str) -> str:
    """Run this interpreter with ``args`` in ``cwd`` (the environment plus ``env``, less
    any QUEUE_TEST_* of the caller's); its output, after a clean exit."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_TEST_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *map(str, args),
        cwd=cwd,
        env={**inherited, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


async def test_the_transactional_enqueue_example_runs() -> None:
    text = await _run(REPO / "docs/examples/transactional_enqueue.py", cwd=REPO)
    assert "completed, output {'sent_to': 'ada@example.com'}" in text
    assert "users: ['ada@example.com'], ada welcomed: True" in text
    assert "jobs per status: {'completed': 1}" in text


async def test_the_sync_wsgi_example_runs_and_the_page_shows_it_as_it_is() -> None:
    example = REPO / "docs/examples/sync_wsgi_app.py"
    text = await _run(example, cwd=REPO)
    assert text.splitlines() == ["201 1", "201 2", "jobs run: 2", "charged: ['book', 'lamp']"]
    assert example.read_text() in (REPO / "docs" / "sync-apps.md").read_text()


def _readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"^## Example\n.*?^```python\n(.*?)^```", readme, re.S | re.M)
    assert found is not None, "README.md has no python block under '## Example'"
    return found.group(1)


async def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_readme_example())
    text = await _run(tmp_path / "example.py", cwd=tmp_path)  # it writes app.db there
    assert text.splitlines() == [
        "sending the welcome mail to ada@example.com",
        "completed {'sent': True}",
    ]


async def _run_testing_example(**env: str) -> str:
    return await _run("-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=TESTING_EXAMPLE, **env)


async def test_the_testing_example_passes_on_sqlite_and_in_process_notify() -> None:
    assert "3 passed" in await _run_testing_example()


@pytest.fixture
async def own_database(postgres_url: str, prefix: str) -> AsyncIterator[str]:
    """A Postgres database of this test's own (the example uses fixed table names)."""
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(sql(f"CREATE DATABASE {prefix}"))
        yield make_url(postgres_url).set(database=prefix).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(sql(f"DROP DATABASE IF EXISTS {prefix} WITH (FORCE)"))
        await admin.dispose()


async def test_the_same_testing_example_passes_on_postgres_and_redis(
    own_database: str, redis_url: str
) -> None:
    output = await _run_testing_example(
        QUEUE_TEST_DATABASE_URL=own_database, QUEUE_TEST_REDIS_URL=redis_url
    )
    assert "3 passed" in output


def test_the_testing_page_shows_the_example_files_as_they_are() -> None:
    page = (REPO / "docs" / "testing.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    for name in ("conftest.py", "test_signup.py"):
        assert (TESTING_EXAMPLE / name).read_text() in blocks, f"docs/testing.md lacks {name}"
