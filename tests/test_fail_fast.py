"""A database that does not answer is one line users can act on, from every entry
point: ``migrate()`` on either client or the state adapter says what the CLI says, and
a client operation gives up after its bounded wait with ``DatabaseUnavailableError``."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, ConfigurationError, SyncClient
from queuert_notify.cli import main
from queuert_notify.errors import DatabaseUnavailableError
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
from state_adapters.notifications import wait_for_notifications
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.services import free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def closed_url() -> str:
    """A Postgres URL, with a password, on a loopback port nothing listens on."""
    return f"postgresql+psycopg://app:s3cret@127.0.0.1:{free_port()}/jobs"


def cli_line(url: str) -> str:
    result = CliRunner().invoke(main, ["migrate", "--database-url", url])
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    return line


def test_migrate_on_an_unreachable_database_says_what_the_cli_says(closed_url: str) -> None:
    expected = cli_line(closed_url)  # the CLI runs its own event loop
    assert "s3cret" not in expected and "app:***@127.0.0.1" in expected

    async def from_async_callers() -> list[pytest.ExceptionInfo[ConfigurationError]]:
        engine = create_async_engine(closed_url)
        state = SqlAlchemyStateAdapter(engine)
        try:
            with pytest.raises(ConfigurationError) as from_state:
                await state.migrate()
            with pytest.raises(ConfigurationError) as from_client:
                await Client(state=state, notify=NoopNotifyAdapter()).migrate()
        finally:
            await engine.dispose()
        return [from_state, from_client]

    raised = asyncio.run(from_async_callers())
    sync_engine = create_engine(closed_url)
    try:
        with pytest.raises(ConfigurationError) as from_sync_client:
            SyncClient(sync_engine).migrate()
    finally:
        sync_engine.dispose()

    for error in [*raised, from_sync_client]:
        assert expected.endswith(str(error.value))
        assert error.value.__cause__ is None and error.value.__suppress_context__


async def test_a_client_call_gives_up_on_an_unreachable_database_with_one_line(
    closed_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_async_engine(closed_url)
    client = Client(
        state=SqlAlchemyStateAdapter(engine), notify=NoopNotifyAdapter(), database_timeout=3.0
    )
    caplog.set_level(logging.INFO)
    try:
        with pytest.raises(DatabaseUnavailableError) as raised:
            await client.start_chain("charge", {"order": 1})
    finally:
        await engine.dispose()
    message = str(raised.value)
    assert message.startswith("gave up after 3s")
    assert "app:***@127.0.0.1" in message and "s3cret" not in message
    assert "\n" not in message and raised.value.__cause__ is None
    # One WARNING for the whole wait; the other attempts at DEBUG. (The wait is 3 s, not
    # less: a first attempt stalled past a shorter one gives up without retrying -- and
    # so without the warning that a retry starts with.)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "Traceback" not in caplog.text


def test_a_sync_client_call_on_an_unreachable_database_is_one_line(closed_url: str) -> None:
    engine = create_engine(closed_url)
    try:
        with pytest.raises(DatabaseUnavailableError) as raised:
            SyncClient(engine).start_chain("charge", {"order": 1})
    finally:
        engine.dispose()
    assert "app:***@127.0.0.1" in str(raised.value) and "\n" not in str(raised.value)


def run_worker_cli(database_url: str, *options: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "QT_DATABASE_URL": database_url,
        "QT_TABLE_PREFIX": "qn_fail_fast_",
        "COLUMNS": "80",  # a narrow terminal must not fold a line in two
    }
    command = [sys.executable, "-m", "queuert_notify.cli", "worker"]
    return subprocess.run(
        [*command, "tests.support.e2e_app:build_worker", "--processes=1", *options],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )


def test_a_worker_pointed_at_a_closed_port_gives_up_after_its_startup_timeout(
    closed_url: str,
) -> None:
    finished = run_worker_cli(closed_url, "--startup-timeout=4")
    output = finished.stdout + finished.stderr
    lines = output.strip().splitlines()
    tries = [line for line in lines if "database unreachable at start" in line]

    assert finished.returncode != 0
    assert "Traceback" not in output and "s3cret" not in output
    assert len(tries) >= 2  # it did wait: 1 s, 2 s, then the rest of the 4 s
    # The banner, one line per try, the one-line error: nothing else.
    assert len(lines) == 1 + len(tries) + 1, output
    assert lines[-1].startswith("Error: ConfigurationError: gave up after 4s")
    assert "app:***@127.0.0.1" in lines[-1]


def test_a_worker_on_a_database_that_does_not_exist_fails_at_once(postgres_url: str) -> None:
    missing = postgres_url.rsplit("/", 1)[0] + "/queuert_no_such_database"
    finished = run_worker_cli(missing, "--startup-timeout=600")
    output = finished.stdout + finished.stderr
    assert finished.returncode != 0
    assert "database unreachable at start" not in output and "Traceback" not in output
    assert 'database "queuert_no_such_database" does not exist' in output.splitlines()[-1]


async def test_a_notify_server_that_is_down_costs_the_producer_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    notify = RedisNotifyAdapter(f"redis://127.0.0.1:{free_port()}/0", prefix="qn-ff")
    caplog.set_level(logging.INFO)
    try:
        async with Client(state=state, notify=notify) as client:
            for n in range(20):
                await client.start_chain("charge", {"order": n})
                assert await wait_for_notifications(timeout=10)
    finally:
        await engine.dispose()
    published = [r for r in caplog.records if r.name == "state_adapters.notifications"]
    assert [r.levelname for r in published] == ["WARNING"]
    assert "sending a notification failed: " in published[0].getMessage()
    assert not published[0].exc_info and "Traceback" not in caplog.text
