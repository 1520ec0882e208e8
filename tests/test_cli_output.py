"""What the CLI writes when nobody watches a terminal: worker logs as plain or JSON
lines that name the job, and chain listings as JSON or tables not folded at 80
columns."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client
from queuert_notify.cli import main
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter

WORKER_MODULE = """
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, Worker
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter


async def boom(job, ctx):
    raise RuntimeError("boom")


async def build():
    state = SqlAlchemyStateAdapter(create_async_engine({url!r}))
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as starter:
        await starter.start_chain("boom", {{}}, max_attempts=2)
    client = Client(state=state, notify=InProcessNotifyAdapter())
    return Worker(client, handlers={{"boom": boom}}, retry_backoff=lambda attempt: 0.0)
"""


def _worker_log(tmp_path: Path, *options: str) -> list[str]:
    """Run ``queuert-notify worker`` off a terminal until the chain has failed for
    good; its stderr lines."""
    (tmp_path / "failing_app.py").write_text(
        WORKER_MODULE.format(url=f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "queuert_notify.cli",
            "worker",
            "failing_app:build",
            "--processes=1",
            *options,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if "no attempts left" in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    return lines


def test_worker_text_logs_off_a_terminal_are_unwrapped_lines_naming_the_job(
    tmp_path: Path,
) -> None:
    lines = _worker_log(tmp_path, "--log-format", "text")

    retried = [line for line in lines if "failed; will retry" in line]
    (failed,) = [line for line in lines if "no attempts left" in line]
    assert len(retried) == 1 and len(retried[0]) > 80
    assert " WARNING queuert_notify.worker.job_outcome: job " in retried[0]
    assert retried[0].endswith("(boom) attempt 1 failed; will retry: RuntimeError: boom")
    assert " ERROR queuert_notify.worker.job_outcome: job " in failed
    assert failed.endswith("(boom) attempt 2 failed; no attempts left: RuntimeError: boom")
    assert "Traceback (most recent call last):" in lines


def test_worker_json_logs_are_one_object_per_line_with_the_extra_keys(tmp_path: Path) -> None:
    records = [json.loads(line) for line in _worker_log(tmp_path, "--log-format", "json")]

    retried, failed = (
        r for r in records if r["logger"] == "queuert_notify.worker.job_outcome" and "job_id" in r
    )
    for record, attempt in ((retried, 1), (failed, 2)):
        assert record["type_name"] == "boom" and record["attempt"] == attempt
        assert record["message"].startswith(f"job {record['job_id']} (boom) attempt {attempt}")
        assert record["exception"].startswith("Traceback (most recent call last):")
        assert record["worker_id"]
    assert (retried["level"], failed["level"]) == ("WARNING", "ERROR")
    assert retried["retry_at"]


@pytest.fixture
def chain_database(tmp_path: Path) -> tuple[str, str]:
    """A migrated SQLite file holding one chain with a long type name; (url, chain id)."""
    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"

    async def start() -> str:
        engine = create_async_engine(url)
        state = SqlAlchemyStateAdapter(engine)
        await state.migrate()
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            chain = await client.start_chain(LONG_TYPE, {"to": "a@example.com"})
        await engine.dispose()
        return chain.id

    return url, asyncio.run(start())


LONG_TYPE = "send-the-quarterly-newsletter-to-every-subscriber-of-the-europe-region"


def _invoke(*args: str) -> str:
    # No COLUMNS: like output piped to a file.
    result = CliRunner(env={"COLUMNS": None}).invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_chains_list_off_a_terminal_is_not_folded_at_80_columns(
    chain_database: tuple[str, str],
) -> None:
    url, chain_id = chain_database
    output = _invoke("chains", "list", "--database-url", url)
    (row,) = [line for line in output.splitlines() if chain_id in line]
    assert LONG_TYPE in row and "pending" in row
    assert len(row) > 80


def test_chains_list_and_show_print_json(chain_database: tuple[str, str]) -> None:
    url, chain_id = chain_database

    listed: dict[str, Any] = json.loads(_invoke("chains", "list", "--json", "--database-url", url))
    shown: dict[str, Any] = json.loads(
        _invoke("chains", "show", chain_id, "--json", "--database-url", url)
    )

    (chain,) = listed["chains"]
    assert listed["next_cursor"] is None
    assert (chain["id"], chain["type_name"], chain["status"]) == (chain_id, LONG_TYPE, "pending")
    assert chain["created_at"].endswith("+00:00")
    assert shown["chain"]["id"] == chain_id
    (job,) = shown["jobs"]
    assert job["input"] == {"to": "a@example.com"} and job["attempt"] == 0
    assert "lease_token" not in job and "lease_token" not in chain["last_job"]
