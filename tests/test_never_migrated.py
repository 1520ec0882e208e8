"""A database whose queue tables were never migrated: one line that says to run
migrate(), from the client, the worker and every CLI command, on Postgres and SQLite."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify import Client, ConfigurationError, Worker
from queuert_notify.cli import main
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter
from tests.support.queue_helpers import STATE_KINDS, drop_tables, sync_url, wait_until


def _expected(prefix: str, table: str) -> str:
    return (
        f"the queue's table {prefix}_{table} does not exist: this database was never migrated "
        f"for table prefix '{prefix}_'; run `await state.migrate()` or `queuert-notify migrate "
        f"--database-url URL --table-prefix {prefix}_` first"
    )


pytest_plugins = ["tests.support.queue_fixtures"]
pytestmark = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)


@pytest.fixture
async def client(engine: AsyncEngine, prefix: str) -> AsyncIterator[Client]:
    """A client on tables that were never migrated (the engine fixture drops any left)."""
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        yield client


async def test_starting_a_chain_says_to_run_migrate(client: Client, prefix: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        await client.start_chain("t", {})
    assert str(raised.value) == _expected(prefix, "chains")


def test_the_sync_client_says_to_run_migrate(database_url: str, prefix: str) -> None:
    from sqlalchemy import create_engine

    from queuert_notify import SyncClient

    engine = create_engine(sync_url(database_url))
    client = SyncClient(engine, table_prefix=f"{prefix}_")
    try:
        with pytest.raises(ConfigurationError) as raised:
            client.start_chain("send-email", {"to": "a@b.c"})
        assert str(raised.value) == _expected(prefix, "chains")
        with pytest.raises(ConfigurationError, match="never migrated"):
            client.get_chain("some-chain")
    finally:
        engine.dispose()


async def test_reading_says_to_run_migrate(client: Client, prefix: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        await client.state.list_chains()
    assert str(raised.value) == _expected(prefix, "chains")
    with pytest.raises(ConfigurationError) as raised:
        await client.state.next_due_at(["t"])
    assert str(raised.value) == _expected(prefix, "jobs")


async def test_the_worker_fails_at_start_with_one_line_and_no_traceback(
    client: Client, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(job: object, ctx: object) -> None:
        return None

    caplog.set_level(logging.DEBUG)
    worker = Worker(client, handlers={"t": handler}, poll_interval=0.05)
    with pytest.raises(ConfigurationError) as raised:
        await asyncio.wait_for(worker.__aenter__(), 10)
    assert str(raised.value) == _expected(prefix, "jobs")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_a_missing_table_of_the_application_is_not_ours(
    client: Client, engine: AsyncEngine, prefix: str
) -> None:
    with pytest.raises(DBAPIError):
        async with engine.connect() as conn:
            await conn.execute(text(f"SELECT * FROM {prefix}_orders"))


@pytest.mark.parametrize(
    ("command", "table"),
    [(["chains", "list"], "chains"), (["chains", "show", "0" * 32], "chains")],
)
def test_cli_commands_print_one_line_and_fail(
    command: list[str], table: str, database_url: str, prefix: str
) -> None:
    result = CliRunner().invoke(
        main, [*command, "--database-url", database_url, "--table-prefix", f"{prefix}_"]
    )
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [f"Error: ConfigurationError: {_expected(prefix, table)}"]


WORKER_MODULE = """
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, Worker
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter


async def handler(job, ctx):
    return None


def build():
    state = SqlAlchemyStateAdapter(create_async_engine({url!r}), table_prefix={prefix!r})
    return Worker(Client(state=state, notify=InProcessNotifyAdapter()), handlers={{"t": handler}})
"""


def test_the_worker_command_prints_one_line_and_exits(
    tmp_path: Path, database_url: str, prefix: str
) -> None:
    (tmp_path / "never_migrated_app.py").write_text(
        WORKER_MODULE.format(url=database_url, prefix=f"{prefix}_")
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "queuert_notify.cli",
            "worker",
            "never_migrated_app:build",
            "--processes=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"Error: ConfigurationError: {_expected(prefix, 'jobs')}"]


async def test_a_worker_whose_tables_are_dropped_stops_with_the_error(
    client: Client, engine: AsyncEngine, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(job: object, ctx: object) -> None:
        return None

    caplog.set_level(logging.INFO, logger="queuert_notify.worker.worker")
    await client.state.migrate()
    worker = Worker(client, handlers={"t": handler}, poll_interval=0.05)
    running = asyncio.create_task(worker.run(handle_signals=False))
    await wait_until(lambda: any(r.message == "worker started" for r in caplog.records))
    await drop_tables(engine, f"{prefix}_")

    with pytest.raises(ConfigurationError) as raised:
        await asyncio.wait_for(running, 10)
    # The first of the queue's tables its next claim reads: the list of paused and
    # limited types (read once a second) or the jobs.
    assert str(raised.value) in {_expected(prefix, "jobs"), _expected(prefix, "type_controls")}
    # The loop's own lines. The registry and the reaper run beside it: on a loaded
    # machine their first write may come after the DROP, and the registry then reports
    # the missing table once itself (it must: a registry table alone may be missing).
    warnings = [
        r.message
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "queuert_notify.worker.worker"
    ]
    # A claim reads the jobs and the type controls: on Postgres the DROP of both may
    # deadlock with it once (a retried loop pass) before the error is seen.
    assert warnings[-1] == f"worker stopped: {raised.value}"
    assert all(w.startswith("worker loop failed") for w in warnings[:-1]), warnings


async def test_tables_without_the_claim_function_say_to_adopt_them(
    client: Client, engine: AsyncEngine, prefix: str, state_kind: str
) -> None:
    if state_kind == "sqlite":
        pytest.skip("the function of limited claims is Postgres's")
    state = client.state
    await state.migrate()
    # As tables made by the application's own Alembic: the function is missing.
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP FUNCTION {prefix}_claim_limited"))
    await client.set_limits("t", concurrency=1)
    with pytest.raises(ConfigurationError) as raised:
        await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=1)
    assert f"function {prefix}_claim_limited" in str(raised.value)
    assert "queuert-notify migrate --adopt" in str(raised.value)
