"""``queuert-notify workers``, the flags ``chains list`` raises, its paging, the
environment every server option reads, and the line a change without Redis prints."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client
from queuert_notify.cli import main
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter


@pytest.fixture
def env(tmp_path: Path, prefix: str) -> dict[str, str]:
    """The job database and table prefix through the environment only."""
    return {
        "QUEUERT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/jobs.db",
        "QUEUERT_TABLE_PREFIX": f"{prefix}_",
        "COLUMNS": "200",
    }


def invoke(env: dict[str, str], *args: str) -> Result:
    return CliRunner(env=env).invoke(main, list(args), catch_exceptions=False)


def on_client(env: dict[str, str], action: Any, **options: Any) -> Any:
    async def go() -> Any:
        engine = create_async_engine(env["QUEUERT_DATABASE_URL"])
        try:
            state = SqlAlchemyStateAdapter(
                engine, table_prefix=env["QUEUERT_TABLE_PREFIX"], **options
            )
            await state.migrate()
            async with Client(state=state, notify=NoopNotifyAdapter()) as client:
                return await action(client)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_workers_and_chains_list_flag_a_type_no_live_worker_handles(
    env: dict[str, str],
) -> None:
    async def setup(client: Client) -> None:
        await client.state.record_worker(
            "w-1", host="box", pid=7, type_names=["charge"], slots=4, starting=True
        )
        await client.start_chain("chrage", {"order": 1})

    on_client(env, setup)
    listed = json.loads(invoke(env, "workers", "--json").output)
    (worker,) = listed["workers"]
    assert (worker["id"], worker["type_names"], worker["slots"], worker["alive"]) == (
        "w-1",
        ["charge"],
        4,
        True,
    )
    assert listed["unhandled_types"] == {"chrage": 1}
    line = (
        "1 jobs of type 'chrage' are due and no live worker handles that type; known types: charge"
    )
    assert line in invoke(env, "workers").output
    assert line in invoke(env, "chains", "list").output
    assert json.loads(invoke(env, "chains", "list", "--json").output)["unhandled_types"] == {
        "chrage": 1
    }


def test_chains_list_prints_the_cursor_of_the_next_page(env: dict[str, str]) -> None:
    async def setup(client: Client) -> list[str]:
        return [(await client.start_chain("charge", delay=3600)).id for _ in range(3)]

    first, second, third = on_client(env, setup)
    output = invoke(env, "chains", "list", "--limit", "2").output
    assert f"more: --after {second}" in output
    rest = invoke(env, "chains", "list", "--limit", "2", "--after", second).output
    assert first in rest and second not in rest and third not in rest


def test_chains_show_of_a_job_that_completed_after_a_retry_shows_no_error(
    env: dict[str, str],
) -> None:
    async def setup(client: Client) -> str:
        chain = await client.start_chain("flaky")

        async def flaky(job: Any, ctx: Any) -> str:
            if job.attempt == 1:
                raise RuntimeError("card declined")
            return "charged"

        await run_until_idle(client, {"flaky": flaky})
        return chain.id

    chain_id = on_client(env, setup, backoff_base=0.0, backoff_cap=0.0)
    shown = invoke(env, "chains", "show", chain_id).output
    assert "completed" in shown and "card declined" not in shown
    # The record keeps it: the history is there for whoever asks for every field.
    (job,) = json.loads(invoke(env, "chains", "show", chain_id, "--json").output)["jobs"]
    assert "card declined" in job["last_error"]


def test_a_change_without_redis_says_workers_see_it_on_their_next_poll(
    env: dict[str, str],
) -> None:
    async def setup(client: Client) -> str:
        return (await client.start_chain("charge", delay=3600)).id

    chain_id = on_client(env, setup)
    result = invoke(env, "chains", "cancel", chain_id)
    assert result.exit_code == 0
    assert result.stderr.strip() == (
        "no --redis-url (or $QUEUERT_REDIS_URL): workers see this change on their next poll"
    )
    result = invoke({**env, "QUEUERT_REDIS_URL": "redis://127.0.0.1:1/0"}, "pause", "charge")
    assert "next poll" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [["chains", "cancel"], ["chains", "retry"], ["pause"], ["resume"], ["limits"], ["dashboard"]],
)
def test_every_server_option_names_its_environment_variable(
    env: dict[str, str], command: list[str]
) -> None:
    shown = " ".join(invoke({"COLUMNS": "200"}, *command, "--help").output.split())
    for variable in (
        "QUEUERT_DATABASE_URL",
        "QUEUERT_TABLE_PREFIX",
        "QUEUERT_REDIS_URL",
        "QUEUERT_REDIS_PREFIX",
    ):
        assert f"env var: {variable}" in shown


def test_a_missing_sqlite_database_is_one_line_and_no_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    result = invoke({"COLUMNS": "200"}, "chains", "list", "--database-url", f"sqlite:///{path}")
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert "was never migrated" in line and "queuert-notify migrate" in line
    assert list(tmp_path.iterdir()) == []
    assert invoke({}, "migrate", "--database-url", f"sqlite:///{path}").exit_code == 0
    assert path.exists()
