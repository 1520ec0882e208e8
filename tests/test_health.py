"""The health report (``client.health()``, ``queuert-notify health``): a transaction
held open while jobs churn is named with its backend and age and fails ``--check``
until it ends and vacuum runs; young transactions are no finding; a backend's query
shows without its literals; the backlog and lapsed leases are judged; the autovacuum
settings migration 0008 gives the queue's tables; SQLite says what it can; the sync
client reads the same report."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import Client, HealthThresholds, NoopNotifyAdapter, SyncClient
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.held_horizon import churn, held_snapshot, holds_the_horizon
from tests.support.queue_helpers import drop_tables

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def pg_state(postgres_url: str, prefix: str) -> AsyncIterator[SqlAlchemyStateAdapter]:
    engine = create_async_engine(postgres_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    try:
        yield state
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def cli(database_url: str, prefix: str, *args: str) -> tuple[int, str]:
    """``queuert-notify health`` in a process of its own: exit status and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "queuert_notify.cli",
        "health",
        "--table-prefix",
        f"{prefix}_",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "QUEUERT_DATABASE_URL": database_url, "COLUMNS": "200"},
    )
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def vacuum(engine: AsyncEngine, prefix: str) -> None:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("jobs", "chains"):
            await conn.execute(text(f"VACUUM {prefix}_{table}"))


@holds_the_horizon
async def test_a_snapshot_held_while_jobs_churn_fails_the_check_until_released_and_vacuumed(
    postgres_url: str, prefix: str, pg_state: SqlAlchemyStateAdapter
) -> None:
    holder = await held_snapshot(postgres_url)
    pid = holder.info.backend_pid
    held_since = time.monotonic()
    try:
        await churn(pg_state, 5_000)
        # The threshold is set low rather than the transaction kept open long: it is
        # already older than this when the report runs.
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - held_since)))
        status, out = await cli(postgres_url, prefix, "--check", "--horizon-age", "0.5")
        assert status in (1, 2), out
        assert f"backend {pid} (analytics-report, idle in transaction)" in out
        status, out = await cli(postgres_url, prefix, "--json", "--horizon-age", "0.5")
        report = json.loads(out)
        (held,) = [h for h in report["horizon"] if h["pid"] == pid]
        assert held["kind"] == "transaction" and held["age_seconds"] >= 0.5
        assert held["query"] == "SELECT 1"
        # While it is held, vacuum cannot remove what the churn left behind.
        await vacuum(pg_state.engine, prefix)
        stuck = await pg_state.health(thresholds=HealthThresholds(horizon_age=0.5))
        (jobs,) = [t for t in stuck.tables if t.name == f"{prefix}_jobs"]
        assert jobs.dead_rows >= 5_000
        assert any(f.subject == f"table {prefix}_jobs" for f in stuck.problems())
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    # Released: vacuum removes them. Other tests on this server may hold a snapshot for
    # a moment, so vacuum is tried again until one run gets through (a bounded number).
    for _ in range(20):
        await vacuum(pg_state.engine, prefix)
        status, out = await cli(postgres_url, prefix, "--check")
        if status == 0:
            break
        await asyncio.sleep(0.5)
    assert status == 0, out
    assert out.startswith("OK postgresql")


@holds_the_horizon
async def test_a_transaction_is_a_finding_from_the_threshold_on_and_its_literals_never_show(
    postgres_url: str, pg_state: SqlAlchemyStateAdapter
) -> None:
    holder = await held_snapshot(
        postgres_url, "SELECT 1", "SELECT 'card 4242 4242 4242 4242' AS secret /* report */"
    )
    pid = holder.info.backend_pid
    try:
        young = await pg_state.health()  # the default: 60 s
        assert pid not in {h.pid for h in young.horizon}
        await asyncio.sleep(0.2)
        old = await pg_state.health(thresholds=HealthThresholds(horizon_age=0.1))
        (held,) = [h for h in old.horizon if h.pid == pid]
        assert held.query == "SELECT '?' AS secret /* report */"
        finding = next(f for f in old.findings if f"backend {pid}" in f.summary)
        assert finding.severity == "warning" and "4242" not in finding.summary
        assert f"pg_terminate_backend({pid})" in finding.action
        critical = await pg_state.health(
            thresholds=HealthThresholds(horizon_age=0.1, horizon_critical_age=0.1)
        )
        assert critical.severity == "critical"
    finally:
        await holder.close()


async def test_the_queue_tables_get_autovacuum_settings_an_operator_can_override(
    postgres_url: str, prefix: str, pg_state: SqlAlchemyStateAdapter
) -> None:
    report = await pg_state.health()
    settings = {t.name: set(t.settings) for t in report.tables}
    for table in ("jobs", "chains", "blockers", "dedup_keys"):
        assert "autovacuum_vacuum_scale_factor=0.02" in settings[f"{prefix}_{table}"]
    async with pg_state.engine.begin() as conn:
        await conn.execute(
            text(f"ALTER TABLE {prefix}_jobs SET (autovacuum_vacuum_scale_factor = 0.005)")
        )
    await pg_state.migrate()  # runs nothing again: the operator's value stays
    report = await pg_state.health()
    (jobs,) = [t for t in report.tables if t.name == f"{prefix}_jobs"]
    assert "autovacuum_vacuum_scale_factor=0.005" in jobs.settings


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"])
async def test_due_jobs_waiting_and_lapsed_leases_are_findings_paused_types_are_not(
    state_kind: str, request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> None:
    url = (
        f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
        if state_kind == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = create_async_engine(url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    try:
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:
            for _ in range(3):
                await client.start_chain("send-email", {})
            await client.start_chain("report", {})
            await client.pause_type("report")
            await state.acquire(["send-email"], worker_id="w", lease_seconds=0.01, limit=1)
            await asyncio.sleep(0.05)
            calm = await client.health()
            # (On a shared server another's old transaction may be a finding of its own.)
            assert not [f for f in calm.problems() if f.subject in ("backlog", "leases")]
            assert (calm.backlog.pending, calm.backlog.due) == (2, 2)
            strict = await client.health(
                thresholds=HealthThresholds(due_wait=0.01, lease_grace=0.0)
            )
            by_subject = {f.subject: f for f in strict.problems()}
            assert by_subject["backlog"].summary.startswith("2 jobs are due")
            assert by_subject["leases"].summary.startswith("1 running jobs' leases ran out")
            assert strict.backlog.expired_leases == 1 and strict.severity != "ok"
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def test_on_sqlite_the_report_runs_and_says_what_it_can(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    engine = create_async_engine(url)
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    try:
        await churn(state, 500)
        report = await state.health()
    finally:
        await engine.dispose()
    assert report.database == "sqlite" and report.severity == "ok"
    assert report.facts["journal_mode"] == "wal" and report.facts["pages"] > 0
    assert "last checkpoint" in report.facts["not_available"]
    assert report.tables == () and report.horizon == ()
    status, out = await cli(url, "queuert", "--check")
    assert status == 0, out
    assert "ok       storage:" in out


@pytest.mark.parametrize("state_kind", ["sqlite", "postgres"])
def test_the_sync_client_reads_the_same_report(
    state_kind: str, request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> None:
    url = (
        f"sqlite:///{tmp_path}/jobs.db"
        if state_kind == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = create_engine(url)
    try:
        with SyncClient(engine, table_prefix=f"{prefix}_") as client:
            client.migrate()
            client.start_chain("send-email", {})
            report = client.health()
        assert report.backlog.pending == 1
        assert not [f for f in report.problems() if f.subject in ("backlog", "leases")]
        if state_kind == "postgres":
            assert {f"{prefix}_jobs", f"{prefix}_chains"} <= {t.name for t in report.tables}
        else:
            assert report.facts["journal_mode"] == "wal"
    finally:
        with engine.begin() as conn:
            mine = MetaData()
            mine.reflect(conn, only=lambda name, _: name.startswith(f"{prefix}_"))
            mine.drop_all(conn)
            if state_kind == "postgres":
                conn.exec_driver_sql(f'DROP FUNCTION IF EXISTS "{prefix}_claim_limited"')
        engine.dispose()


async def test_the_dashboard_shows_the_report_on_its_health_page(tmp_path: Path) -> None:
    import httpx

    from queuert_notify.dashboard import create_app

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    try:
        await state.start_chains([NewChain(NewJob("send-email", {}))], notes=NotificationBuffer())
        transport = httpx.ASGITransport(app=create_app(state))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
            page = await http.get("/health")
            refused = await http.get("/health?horizon_age=soon")
            overview = await http.get("/")
    finally:
        await engine.dispose()
    assert page.status_code == 200
    assert 'id="health-severity" class="severity sev-ok" data-severity="ok"' in page.text
    assert "1 pending, 1 due" in page.text and "journal mode" in page.text
    assert refused.status_code == 400 and "horizon_age must be a number" in refused.text
    assert 'href="/health"' in overview.text


def test_dead_rows_name_their_cause_a_holder_autovacuum_off_or_autovacuum_behind() -> None:
    from state_adapters.health import HorizonHolder, TableHealth
    from state_adapters.postgres.health import table_findings

    def jobs(*settings: str) -> TableHealth:
        return TableHealth(
            "q_jobs", 10_000, 30_000, 0, None, None, None, None, 1 << 20, 1 << 20, settings
        )

    holder = HorizonHolder("transaction", "42", 90.0, 1_000, pid=42)
    limits = HealthThresholds()
    (held,) = table_findings([jobs()], [holder], limits)
    (off,) = table_findings([jobs()], [], limits, autovacuum=False)
    (disabled,) = table_findings([jobs("autovacuum_enabled=false")], [], limits)
    (behind,) = table_findings([jobs()], [], limits)
    assert held.severity == "critical" and "30000 dead row versions, 75%" in held.summary
    assert held.action.startswith("vacuum cannot remove them while backend 42 holds")
    assert off.action.startswith("autovacuum is off") and disabled.action == off.action
    assert behind.action.startswith("autovacuum is behind: VACUUM (VERBOSE) q_jobs")
