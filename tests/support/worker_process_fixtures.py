"""Fixtures for tests with worker processes of ``tests.support.e2e_app``; a module uses them with
``pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.e2e_app import effects_table
from tests.support.worker_processes import DEFAULT_APP, WorkerProcesses


@pytest.fixture
def worker_app() -> str:
    """The ``module:attr`` worker processes run; a test module overrides it for its own app."""
    return DEFAULT_APP


@pytest.fixture
def workers(
    worker_app: str,
    database_url: str,
    table_prefix: str,
    notify_kind: str,
    prefix: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> Iterator[WorkerProcesses]:
    """Starts workers of ``worker_app`` (``tests.support.e2e_app`` unless the test module
    says otherwise) on this test's database and notify kind."""
    env = {"QT_DATABASE_URL": database_url, "QT_TABLE_PREFIX": table_prefix}
    if notify_kind == "redis":
        env["QT_REDIS_URL"] = str(request.getfixturevalue("redis_url"))
        env["QT_REDIS_PREFIX"] = prefix
    procs = WorkerProcesses(env, tmp_path, app=worker_app)
    try:
        yield procs
    finally:
        procs.kill_all()


@pytest.fixture
async def effects(engine: AsyncEngine, table_prefix: str, state: Any) -> Any:
    """The effects table of ``tests.support.e2e_app``, created next to the queue's tables."""
    table = effects_table(table_prefix)
    async with engine.begin() as conn:
        await conn.run_sync(table.create)
    return table
