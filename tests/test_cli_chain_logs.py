"""``queuert-notify chains logs CHAIN_ID --follow``: lines appear while the job runs, and
the command ends (with every line printed) once the chain is final."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from queuert_notify.cli import main
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import DATABASES

pytest_plugins = ["tests.support.queue_fixtures"]

pytestmark = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)


async def _next_line(stream: asyncio.StreamReader) -> dict[str, Any]:
    line = await asyncio.wait_for(stream.readline(), timeout=30)
    assert line, "the command ended before printing the line"
    return dict(json.loads(line))


async def test_follow_prints_lines_while_the_job_runs_and_ends_with_the_chain(
    client: Client, database_url: str, table_prefix: str
) -> None:
    release = asyncio.Event()

    async def steps(job: Job, ctx: JobContext) -> Any:
        ctx.log("step one", n=1)
        await release.wait()
        ctx.log("step two", n=2)
        return ctx.continue_with("last")

    async def last(job: Job, ctx: JobContext) -> None:
        ctx.log("the last job")

    chain = await client.start_chain("steps")
    async with Worker(client, {"steps": steps, "last": last}):
        follower = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "queuert_notify.cli",
            "chains",
            "logs",
            chain.id,
            "--follow",
            "--json",
            "--database-url",
            database_url,
            "--table-prefix",
            table_prefix,
            stdout=asyncio.subprocess.PIPE,
        )
        assert follower.stdout is not None
        try:
            first = await _next_line(follower.stdout)
            # Printed while the handler still waits: the chain is not finished.
            assert (first["message"], first["fields"], first["chain_index"]) == (
                "step one",
                {"n": 1},
                0,
            )
            assert follower.returncode is None
            release.set()
            second = await _next_line(follower.stdout)
            third = await _next_line(follower.stdout)
            assert (second["message"], third["message"]) == ("step two", "the last job")
            assert third["chain_index"] == 1 and third["attempt"] == 1
            assert await asyncio.wait_for(follower.wait(), timeout=30) == 0
        finally:
            if follower.returncode is None:
                follower.kill()
                await follower.wait()


async def test_logs_prints_every_line_once_without_follow(
    client: Client, database_url: str, table_prefix: str
) -> None:
    async def talk(job: Job, ctx: JobContext) -> None:
        ctx.log("hello", who="world")
        ctx.log("bye")

    chain = await client.start_chain("talk")
    async with Worker(client, {"talk": talk}):
        await client.await_chain(chain.id, timeout=20)
    common = ["--database-url", database_url, "--table-prefix", table_prefix]
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["chains", "logs", chain.id, *common]
    )
    assert result.exit_code == 0, result.output
    printed = result.output.splitlines()
    assert len(printed) == 2
    assert 'job 0 attempt 1 INFO    hello  who="world"' in printed[0]
    assert printed[1].endswith("INFO    bye")
    missing = await asyncio.to_thread(
        CliRunner().invoke, main, ["chains", "logs", "no-such-chain", *common]
    )
    assert missing.exit_code == 1 and "ChainNotFoundError" in missing.output
