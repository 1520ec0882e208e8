"""The ``queuert-notify`` command line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.cli import main
from tests.support.services import free_port


def _invoke(*args: str) -> tuple[int, str]:
    # Wide enough that tables show ids and type names in full.
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_demo_runs_on_the_embedded_default_and_prints_a_summary() -> None:
    code, output = _invoke("demo", "--chains", "60", "--workers", "2", "--concurrency", "4")
    assert code == 0, output
    assert "SQLite (fresh temporary file)" in output
    assert "InProcessNotifyAdapter" in output
    assert "throughput" in output
    assert "wake latency" in output
    assert "chains finished" in output
    assert "failed chains" in output
    assert "Traceback" not in output  # the demo's planned failures are not errors to show


def test_demo_runs_on_postgres_and_redis(postgres_url: str, redis_url: str) -> None:
    pytest.importorskip(
        "queuert_notify.notify.redis.adapter", reason="RedisNotifyAdapter not landed"
    )
    code, output = _invoke(
        "demo",
        "--chains",
        "60",
        "--workers",
        "2",
        "--database-url",
        postgres_url,
        "--redis-url",
        redis_url,
        "--mode",
        "staged",
    )
    assert code == 0, output
    assert "RedisNotifyAdapter" in output
    assert "throughput" in output


def test_migrate_then_inspect_chains(tmp_path: Path, prefix: str) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"  # no driver: the CLI picks aiosqlite
    table_prefix = f"{prefix}_"
    code, output = _invoke("migrate", "--database-url", url, "--table-prefix", table_prefix)
    assert code == 0, output
    assert "migrated" in output

    chain_id = asyncio.run(_start_a_chain(f"sqlite+aiosqlite:///{tmp_path}/jobs.db", table_prefix))
    common = ("--database-url", url, "--table-prefix", table_prefix)
    code, output = _invoke("chains", "list", *common)
    assert code == 0, output
    assert chain_id in output
    assert "send-email" in output

    code, output = _invoke("chains", "show", *common, chain_id)
    assert code == 0, output
    assert "pending" in output
    assert "a@b.c" in output

    code, output = _invoke("chains", "show", *common, "no-such-chain")
    assert code == 1
    assert "ChainNotFoundError" in output


def test_stored_values_print_as_they_are_never_as_markup(tmp_path: Path, prefix: str) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    common = ("--database-url", url, "--table-prefix", f"{prefix}_")
    assert _invoke("migrate", *common)[0] == 0
    # Rich markup and an emoji code, as data: "[/x]" closes no tag (rich's MarkupError
    # stopped the command), "[red]" and ":smile:" are text to show as they are.
    value = "[/x] [red]not red[/red] :smile:"
    chain_id = asyncio.run(
        _run_a_chain(f"sqlite+aiosqlite:///{tmp_path}/jobs.db", f"{prefix}_", {"to": value})
    )
    for command in (("chains", "list"), ("chains", "show", chain_id)):
        code, output = _invoke(*command, *common)
        assert code == 0, output
        assert value in output


async def _run_a_chain(url: str, table_prefix: str, echoed: dict[str, str]) -> str:
    """A chain whose job returns its input: ``echoed`` is its input and its output."""
    from queuert_notify.client.client import Client
    from queuert_notify.notify.noop import NoopNotifyAdapter
    from queuert_notify.testing import run_until_idle
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    async def echo(job: Any, ctx: Any) -> Any:
        return job.input

    engine = create_async_engine(url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:
            chain = await client.start_chain("send-email", echoed)
            assert await run_until_idle(client, {"send-email": echo}) == 1
        return chain.id
    finally:
        await engine.dispose()


def test_cancel_retry_and_delete_a_chain(tmp_path: Path, prefix: str) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    table_prefix = f"{prefix}_"
    common = ("--database-url", url, "--table-prefix", table_prefix)
    assert _invoke("migrate", *common)[0] == 0
    chain_id = asyncio.run(_start_a_chain(f"sqlite+aiosqlite:///{tmp_path}/jobs.db", table_prefix))

    code, output = _invoke("chains", "cancel", *common, chain_id)
    assert (code, output.strip().splitlines()) == (
        0,
        [
            f"chain {chain_id} (send-email): cancelled",
            "no --redis-url (or $QUEUERT_REDIS_URL): workers see this change on their next poll",
        ],
    )
    retried = CliRunner().invoke(main, ["chains", "retry", *common, chain_id, "--json"])
    assert retried.exit_code == 0, retried.output
    assert json.loads(retried.stdout)["chain"]["status"] == "pending"
    code, output = _invoke("chains", "retry", *common, chain_id)
    assert code == 1
    assert "InvalidInputError: chain" in output and "is pending" in output

    result = CliRunner().invoke(main, ["chains", "delete", *common, chain_id], input="n\n")
    assert result.exit_code == 1 and "Aborted" in result.output
    code, output = _invoke("chains", "delete", *common, chain_id, "--yes")
    assert (code, output.strip()) == (0, f"deleted chain {chain_id}")
    code, output = _invoke("chains", "show", *common, chain_id)
    assert code == 1 and "ChainNotFoundError" in output


async def _start_a_chain(url: str, table_prefix: str) -> str:
    from queuert_notify.client.client import Client
    from queuert_notify.notify.noop import NoopNotifyAdapter
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    engine = create_async_engine(url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:
            chain = await client.start_chain("send-email", {"to": "a@b.c"})
        return chain.id
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:worker", "cannot import"),
        ("tests.support.e2e_app:no_such_attr", "has no attribute"),
        ("tests.support.queue_helpers:STATE_KINDS", "expected a Worker"),
        ("missing-colon", "module:attr"),
    ],
)
def test_worker_command_explains_a_bad_target(target: str, message: str) -> None:
    result = CliRunner().invoke(main, ["worker", target])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_target_module_that_fails_at_import_is_one_line_without_a_traceback(
    tmp_path: Path, processes: str
) -> None:
    (tmp_path / "broken_jobs.py").write_text(
        "import os\n\nraise RuntimeError('QUEUE_URL is not set')\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "queuert_notify.cli", "worker", "broken_jobs:build"),
            f"--processes={processes}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "Error: importing 'broken_jobs' failed: RuntimeError: QUEUE_URL is not set "
        f"({tmp_path / 'broken_jobs.py'}:3)"
    ]


# -- settings the commands cannot run with ---------------------------------------------

SECRET = "s3cret-in-the-url"


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"mysql://app:{SECRET}@db.example/jobs", "No module named"),
        (f"postgresql+pg8000://app:{SECRET}@db.example/jobs", "No module named"),
        ("sqlite+pysqlite:///jobs.db", "requires an async driver"),
        ("sqlite+aiosqlite://", "in-memory SQLite"),
        ("sqlite:///:memory:", "in-memory SQLite"),
        ("not a url at all", "Could not parse"),
    ],
)
@pytest.mark.parametrize("command", [["demo", "--chains", "5"], ["migrate"], ["chains", "list"]])
def test_an_unsupported_database_url_is_a_one_line_usage_error(
    command: list[str], url: str, reason: str
) -> None:
    result = CliRunner().invoke(main, [*command, "--database-url", url])
    assert result.exit_code == 2, result.output
    assert result.exc_info is None or result.exc_info[0] is SystemExit, "a traceback"
    (error,) = _error_lines(result.output)
    assert error.startswith("Error: ConfigurationError: unsupported database URL")
    assert reason in error
    assert "postgresql+psycopg://" in error  # says what to use instead
    assert SECRET not in result.output
    assert "chains x 3 jobs" not in result.output  # refused before the demo starts


@pytest.mark.parametrize(
    "command",
    [["demo", "--chains", "5"], ["migrate"], ["chains", "list"], ["chains", "show", "0" * 32]],
)
def test_an_unreachable_postgres_is_a_one_line_error_naming_the_masked_address(
    command: list[str],
) -> None:
    port = free_port()
    url = f"postgresql+psycopg://app:{SECRET}@127.0.0.1:{port}/jobs"
    result = CliRunner(env={"COLUMNS": "400"}).invoke(main, [*command, "--database-url", url])
    assert result.exit_code == 1, result.output
    assert result.exc_info is None or result.exc_info[0] is SystemExit, "a traceback"
    (error,) = _error_lines(result.output)
    assert error.startswith(
        f"Error: ConfigurationError: cannot connect to the database at "
        f"postgresql+psycopg://app:***@127.0.0.1:{port}/jobs: "
    )
    assert "Connection refused" in error and "is the server running" in error
    assert SECRET not in result.output


def test_a_sqlite_file_in_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/missing/jobs.db"
    result = CliRunner().invoke(main, ["chains", "list", "--database-url", url])
    assert result.exit_code == 1, result.output
    (error,) = _error_lines(result.output)
    assert "cannot connect to the database at sqlite+aiosqlite:///" in error
    assert "unable to open database file" in error and "directory exist" in error
    assert not (tmp_path / "missing").exists()
