"""Fixtures for client, worker and end-to-end tests: a real database and a real notify
adapter per test, each with names of the test's own, cleaned up afterwards.

``state_kind`` (``STATE_KINDS``) and ``notify_kind`` (``NOTIFY_KINDS`` in
queue_helpers) default to sqlite + in_process; a module parametrizes them indirectly
to run a matrix.
A module uses them with ``pytest_plugins = ["tests.support.queue_fixtures"]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.notify.protocol import NotifyAdapter
from tests.conftest import with_driver
from tests.support.queue_helpers import delete_notify_state, drop_tables, make_notify, sync_url


@pytest.fixture
def state_kind(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def notify_kind(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "in_process"))


@pytest.fixture
def database_url(state_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if state_kind == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    url = str(request.getfixturevalue("postgres_url"))
    return with_driver(url, "asyncpg") if state_kind == "asyncpg" else url


@pytest.fixture
def table_prefix(prefix: str) -> str:
    return f"{prefix}_"


@pytest.fixture
async def engine(database_url: str, table_prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, table_prefix)
        await engine.dispose()


@pytest.fixture
async def state(engine: AsyncEngine, table_prefix: str) -> Any:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    adapter = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
    await adapter.migrate()
    return adapter


@pytest.fixture
async def notify(
    notify_kind: str, request: pytest.FixtureRequest, prefix: str
) -> AsyncIterator[NotifyAdapter]:
    adapter = make_notify(notify_kind, request, prefix)
    try:
        yield adapter
    finally:
        await adapter.close()
        await delete_notify_state(notify_kind, request, prefix)


@pytest.fixture
async def client(state: Any, notify: NotifyAdapter) -> AsyncIterator[Client]:
    async with Client(state=state, notify=notify) as client:
        yield client


@pytest.fixture
def sync_engine(database_url: str, state: Any) -> Iterator[Engine]:
    """A sync engine (for ``SyncClient``) on the test's database, whose queue tables
    ``state`` migrated."""
    engine = create_engine(sync_url(database_url))
    try:
        yield engine
    finally:
        engine.dispose()
