"""``queuert-notify schedules`` and ``queuert-notify prune``."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, Schedule
from queuert_notify.cli import main
from queuert_notify.cli.prune import parse_duration
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    runner = CliRunner(env={"COLUMNS": "200", **(env or {})})
    result = runner.invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


async def _finished_chains(url: str, table_prefix: str, count: int) -> None:
    engine = create_async_engine(url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        await state.migrate()
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:
            for _ in range(count):
                await client.start_chain("done")

            async def done(job: object, ctx: object) -> None:
                return None

            await run_until_idle(client, {"done": done})
    finally:
        await engine.dispose()


def test_prune_deletes_finished_chains_older_than_the_window(tmp_path: Path, prefix: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    asyncio.run(_finished_chains(url, f"{prefix}_", 3))
    args = ["prune", "--database-url", url, "--table-prefix", f"{prefix}_"]
    code, output = _invoke(*args, "--older-than", "7d")
    assert (code, output.strip()) == (0, "deleted 0 finished chains older than 7 days, 0:00:00")
    code, output = _invoke(*args, "--older-than", "0s")
    assert (code, output.strip()) == (0, "deleted 3 finished chains older than 0:00:00")


def test_prune_refuses_a_duration_it_cannot_read(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    result = CliRunner().invoke(main, ["prune", "--database-url", url, "--older-than", "7 days"])
    assert result.exit_code == 2
    assert "Invalid value for --older-than: '7 days' is not a duration" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("1d12h", timedelta(hours=36)),
        ("90m", timedelta(minutes=90)),
        ("30s", timedelta(seconds=30)),
        ("2w", timedelta(weeks=2)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_durations_read_by_prune(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_schedules_lists_each_schedule_with_its_last_and_next_tick(
    tmp_path: Path, prefix: str
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    table_prefix = f"{prefix}_"
    env = {"QT_DATABASE_URL": url, "QT_TABLE_PREFIX": table_prefix, "QT_SCHEDULE_EVERY": "3600"}
    asyncio.run(_finished_chains(url, table_prefix, 0))
    code, output = _invoke("schedules", "tests.support.e2e_app:build_worker", env=env)
    assert code == 0, output
    assert "e2e-every" in output and "every 1:00:00" in output

    hourly = Schedule("e2e-every", "effect", every=timedelta(hours=1))
    now = datetime.now(UTC)
    asyncio.run(_take(url, table_prefix, hourly.latest_tick(now) - timedelta(hours=2)))
    code, output = _invoke("schedules", "tests.support.e2e_app:build_worker", "--json", env=env)
    assert code == 0, output
    (row,) = json.loads(output)["schedules"]
    assert row["last_tick"] == (hourly.latest_tick(now) - timedelta(hours=2)).isoformat()
    # Two ticks were missed: the latest runs (once) as soon as a worker starts.
    assert row["catch_up"] is True
    assert row["next_tick"] == hourly.latest_tick(now).isoformat()


async def _take(url: str, table_prefix: str, tick: datetime) -> None:
    from state_adapters.notifications import NotificationBuffer

    engine = create_async_engine(url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        await state.take_schedule_tick("e2e-every", tick, None, notes=NotificationBuffer())
    finally:
        await engine.dispose()
