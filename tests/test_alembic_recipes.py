"""The two Alembic recipes of docs/databases.md, run for real: an application project
with its own models, ``alembic revision --autogenerate`` and ``alembic upgrade head`` in
a subprocess, then the queue on the resulting database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify.cli import main
from queuert_notify.errors import ConfigurationError
from state_adapters import SqlAlchemyStateAdapter, make_metadata
from tests.queue_helpers import drop_tables
from tests.test_state_migrations import _start

MODELS = """
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "{prefix}_users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
"""

ENV = """
from alembic import context
from sqlalchemy import create_engine

from app_models import Base
from state_adapters import make_metadata, render_item

{recipe}


def only_this_test(name, type_, parent_names):
    # The test database is shared: leave every other test's tables alone.
    return type_ != "table" or name.startswith("{prefix}_")


def include(name, type_, parent_names):
    return only_this_test(name, type_, parent_names) and include_name(name, type_, parent_names)


with create_engine("{url}").connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=include,
        version_table="{prefix}_app_version",
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
"""

RECIPE_1 = """
# Recipe 1: migrate() owns the queue's tables; keep them out of autogenerate.
target_metadata = Base.metadata
queue_tables = set(make_metadata("{prefix}_").tables)
queue_tables.add("{prefix}_alembic_version")


def include_name(name, type_, parent_names):
    return not (type_ == "table" and name in queue_tables)
"""

RECIPE_2 = """
# Recipe 2: the application's own migrations create the queue's tables.
target_metadata = [Base.metadata, make_metadata("{prefix}_")]


def include_name(name, type_, parent_names):
    return True
"""


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/app.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def engine(database_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


def _project(tmp_path: Path, database_url: str, prefix: str, recipe: str) -> Path:
    """An application's Alembic project (``alembic init``, then its env.py)."""
    project = tmp_path / "app"
    project.mkdir()
    _alembic(project, "init", "migrations")
    (project / "app_models.py").write_text(MODELS.format(prefix=prefix))
    sync_url = database_url.replace("+aiosqlite", "")
    env = ENV.format(recipe=recipe.format(prefix=prefix), prefix=prefix, url=sync_url)
    (project / "migrations" / "env.py").write_text(env)
    return project


def _alembic(project: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _revision(project: Path) -> str:
    """The upgrade() of the revision Alembic autogenerates (imports included)."""
    _alembic(project, "revision", "--autogenerate", "-m", "app")
    (script,) = (project / "migrations" / "versions").glob("*.py")
    return script.read_text().partition("def downgrade")[0]


async def _version(engine: AsyncEngine, table: str) -> str | None:
    async with engine.connect() as conn:
        return await conn.scalar(text(f"SELECT version_num FROM {table}"))


async def test_recipe_1_the_application_autogenerates_around_the_migrated_queue_tables(
    tmp_path: Path, database_url: str, engine: AsyncEngine, prefix: str
) -> None:
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    project = _project(tmp_path, database_url, prefix, RECIPE_1)

    revision = _revision(project)
    assert f"create_table('{prefix}_users'" in revision
    assert f"{prefix}_jobs" not in revision and "drop_table" not in revision
    _alembic(project, "upgrade", "head")

    assert (await state.get_chain((await _start(state)).id)).status == "pending"
    assert await _version(engine, f"{prefix}_alembic_version") == "0001"


async def test_recipe_2_the_autogenerated_revision_creates_the_queue_tables_and_migrate_adopts_them(
    tmp_path: Path, database_url: str, engine: AsyncEngine, prefix: str
) -> None:
    project = _project(tmp_path, database_url, prefix, RECIPE_2)

    revision = _revision(project)
    assert f"create_table('{prefix}_jobs'" in revision
    assert "state_adapters" not in revision  # SQLAlchemy's own types: nothing of ours to import
    _alembic(project, "upgrade", "head")
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    started = await _start(state)
    assert (await state.get_chain(started.id)).status == "pending"

    # migrate() does not silently take over tables it did not create...
    with pytest.raises(ConfigurationError) as refused:
        await state.migrate()
    assert "queuert-notify migrate --adopt" in str(refused.value)
    assert "\n" not in str(refused.value)

    # ...the one documented command does, and from then on migrate() owns them.
    result = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["migrate", "--adopt", "--database-url", database_url, "--table-prefix", f"{prefix}_"],
    )
    assert result.exit_code == 0, result.output
    assert await _version(engine, f"{prefix}_alembic_version") == "0001"
    await state.migrate()
    assert (await state.get_chain(started.id)).status == "pending"
    assert await _version(engine, f"{prefix}_app_version") is not None


async def test_adopting_tables_that_differ_from_the_schema_is_refused_with_the_differences(
    engine: AsyncEngine, prefix: str
) -> None:
    queue = make_metadata(f"{prefix}_")
    partial = MetaData()
    queue.tables[f"{prefix}_chains"].to_metadata(partial)
    async with engine.begin() as conn:
        await conn.run_sync(partial.create_all)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")

    with pytest.raises(ConfigurationError) as refused:
        await state.migrate(adopt=True)

    message = str(refused.value)
    assert message.startswith("cannot adopt the queue's tables")
    assert f"add_table {prefix}_jobs" in message
    async with engine.connect() as conn:
        names = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
    assert f"{prefix}_alembic_version" not in names
