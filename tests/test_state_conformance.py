"""The state-adapter conformance suite against SqlAlchemyStateAdapter on Postgres and SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.testing import StateAdapterConformance
from state_adapters import SqlAlchemyStateAdapter
from tests.support.queue_helpers import drop_tables


class TestSqliteState(StateAdapterConformance):
    @pytest.fixture
    async def state(self, tmp_path: Path) -> AsyncIterator[SqlAlchemyStateAdapter]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
        adapter = SqlAlchemyStateAdapter(engine, table_prefix="conformance_")
        await adapter.migrate()
        try:
            yield adapter
        finally:
            await engine.dispose()


class TestPostgresState(StateAdapterConformance):
    @pytest.fixture
    async def state(
        self, async_postgres_url: str, prefix: str
    ) -> AsyncIterator[SqlAlchemyStateAdapter]:
        engine = create_async_engine(async_postgres_url)
        adapter = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        await adapter.migrate()
        try:
            yield adapter
        finally:
            await drop_tables(engine, f"{prefix}_")
            await engine.dispose()
