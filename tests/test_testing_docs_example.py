"""The "Testing your app" example (docs/testing.md, docs/examples/testing/) passes as
written: on SQLite + in-process notify with no server, and unchanged on Postgres + Redis."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "docs" / "examples" / "testing"


async def _run_example_tests(**env: str) -> str:
    settings = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_TEST_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        cwd=EXAMPLE,
        env={**settings, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        output, _ = await proc.communicate()
    text_ = output.decode(errors="replace")
    assert proc.returncode == 0, text_
    return text_


async def test_the_example_passes_on_sqlite_and_in_process_notify() -> None:
    assert "3 passed" in await _run_example_tests()


@pytest.fixture
async def test_database(postgres_url: str, prefix: str) -> AsyncIterator[str]:
    """A Postgres database of this test's own (the example uses fixed table names)."""
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {prefix}"))
        yield make_url(postgres_url).set(database=prefix).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {prefix} WITH (FORCE)"))
        await admin.dispose()


async def test_the_same_example_passes_on_postgres_and_redis(
    test_database: str, redis_url: str
) -> None:
    output = await _run_example_tests(
        QUEUE_TEST_DATABASE_URL=test_database, QUEUE_TEST_REDIS_URL=redis_url
    )
    assert "3 passed" in output


def test_the_page_shows_the_example_files_as_they_are() -> None:
    page = (REPO / "docs" / "testing.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    for name in ("conftest.py", "test_signup.py"):
        assert (EXAMPLE / name).read_text() in blocks, f"docs/testing.md does not show {name}"
