"""The ``queuert-notify`` command line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.cli import main


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


def test_demo_runs_on_postgres_and_redis(postgres_url: str, redis_url: str) -> None:
    pytest.importorskip("queuert_notify.notify.redis", reason="RedisNotifyAdapter not landed")
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


async def _start_a_chain(url: str, table_prefix: str) -> str:
    from queuert_notify.client import Client
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
        ("tests.e2e_app:no_such_attr", "has no attribute"),
        ("tests.queue_helpers:STATE_KINDS", "expected a Worker"),
        ("missing-colon", "module:attr"),
    ],
)
def test_worker_command_explains_a_bad_target(target: str, message: str) -> None:
    result = CliRunner().invoke(main, ["worker", target])
    assert result.exit_code == 2
    assert message in result.output
