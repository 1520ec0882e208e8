"""The queue in an application's tests: SQLite + in-process notify by default (no
server), Postgres + Redis when QUEUE_TEST_DATABASE_URL and QUEUE_TEST_REDIS_URL are
set. The database is migrated once per session; every test starts from empty tables."""

import asyncio
import os
import uuid

import pytest
from signup_app import Base
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, InProcessNotifyAdapter, RedisNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter, make_metadata

# e.g. postgresql+psycopg://app@localhost/app_test and redis://localhost:6379/0
DATABASE_URL = os.environ.get("QUEUE_TEST_DATABASE_URL")
REDIS_URL = os.environ.get("QUEUE_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def database_url(tmp_path_factory):
    """A database with the application's and the queue's tables, migrated once."""
    url = DATABASE_URL or f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db')}/test.db"

    async def migrate():
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        await SqlAlchemyStateAdapter(engine).migrate()
        await engine.dispose()

    asyncio.run(migrate())
    return url


@pytest.fixture
async def engine(database_url):
    engine = create_async_engine(database_url)
    yield engine
    # Isolation without migrating again: empty every table, children first.
    tables = [*Base.metadata.sorted_tables, *make_metadata().sorted_tables]
    async with engine.begin() as conn:
        for table in reversed(tables):
            await conn.execute(delete(table))
    await engine.dispose()


@pytest.fixture
async def client(engine):
    if REDIS_URL:
        # A channel and key prefix per test: no test wakes another's worker.
        notify = RedisNotifyAdapter(url=REDIS_URL, prefix=f"test-{uuid.uuid4().hex}")
    else:
        notify = InProcessNotifyAdapter()
    async with Client(state=SqlAlchemyStateAdapter(engine), notify=notify) as client:
        yield client
