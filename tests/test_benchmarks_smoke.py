"""A tiny run of every benchmark, so none of them can rot; the real runs are in
docs/benchmarks.md. Figures are not asserted here: only that each benchmark
completes against the real services and reports what it promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks import runner
from benchmarks.cli import run_benchmark
from benchmarks.services import free_port, wait_for_port
from tests.support.held_horizon import holds_the_horizon


async def test_alternate_varies_which_variant_runs_first_and_which_runs_before_it() -> None:
    order: list[str] = []

    def variant(name: str) -> runner.Variant:
        async def one_round() -> runner.Figures:
            order.append(name)
            return {"value": float(len(order))}

        return runner.Variant(name, one_round)

    results = await runner.alternate([variant("a"), variant("b"), variant("c")], 3, warmup=0)

    # Rotated by one each round, every other round reversed: b follows a, then c, then a.
    assert order == ["a", "b", "c", "a", "c", "b", "c", "a", "b"]
    assert results.medians("a") == {"value": 4.0}
    # b ran 2nd, 6th, 9th and a 1st, 4th, 8th: ratios 2, 3/2, 9/8.
    assert results.ratio("b", "a") == {"value": pytest.approx(3 / 2)}


def test_percentiles_use_nearest_rank_in_milliseconds() -> None:
    samples = [index / 1000 for index in range(1, 101)]  # 1 ms .. 100 ms

    figures = runner.percentiles(samples)

    assert figures == {
        "p50 ms": pytest.approx(50),
        "p90 ms": pytest.approx(90),
        "p99 ms": pytest.approx(99),
        "max ms": pytest.approx(100),
    }


def test_waiting_for_a_server_that_exited_fails_at_once_with_its_exit_status() -> None:
    server = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server.wait()

    # Without the process, this would wait out the timeout (an hour) for a port nobody binds.
    with pytest.raises(RuntimeError, match=r"exited \(3\)"):
        wait_for_port(free_port(), server, timeout=3600)


async def test_notify_overhead_reports_every_adapter_the_ratios_and_listener_memory(
    redis_url: str, postgres_url: str, nats_url: str
) -> None:
    report = await run_benchmark(
        [
            "notify-overhead",
            "--rounds=1",
            "--samples=5",
            "--messages=50",
            "--hint-pairs=10",
            "--listeners=20",
            f"--redis-url={redis_url}",
            f"--postgres-url={postgres_url}",
            f"--nats-url={nats_url}",
        ]
    )

    for row in ("| RedisNotifyAdapter |", "| bare redis-py |", "| ratio adapter / bare |"):
        assert row in report
    for adapter in ("InProcessNotifyAdapter", "PostgresNotifyAdapter", "NatsNotifyAdapter"):
        assert f"| {adapter} |" in report
    assert "| RedisNotifyAdapter(cluster=True) |" in report
    assert "| ratio cluster / single node |" in report
    assert "bytes per listener" in report
    assert "pairs/s, 1 task" in report


async def test_sync_publish_reports_one_server_and_cluster_in_both_wake_modes(
    redis_url: str,
) -> None:
    report = await run_benchmark(
        ["sync-publish", "--rounds=1", "--publishes=20", f"--redis-url={redis_url}"]
    )

    for wake in ("pubsub", "lists"):
        assert f"| one server, wake={wake} |" in report
        assert f"| cluster, wake={wake} |" in report
        assert f"| wake={wake}: cluster / one server |" in report
    assert "3 types, 3 masters p50 µs" in report


async def test_wake_hints_reports_every_call_against_a_bare_round_trip(redis_url: str) -> None:
    report = await run_benchmark(
        ["wake-hints", "--rounds=1", "--calls=50", f"--redis-url={redis_url}"]
    )

    assert "| consume_wake_hint (budget left) |" in report
    assert "| bare redis-py PING |" in report


def _services(redis_url: str, postgres_url: str) -> list[str]:
    return [f"--redis-url={redis_url}", f"--postgres-url={postgres_url}"]


async def test_start_reports_one_per_tx_concurrent_and_batched_rates_per_combination(
    redis_url: str, postgres_url: str, nats_url: str
) -> None:
    report = await run_benchmark(
        [
            "start",
            "--rounds=1",
            "--chains=6",
            "--batches=1",
            "--tasks=3",
            "--state=postgres,sqlite",
            "--notify=redis,postgres,nats",
            *_services(redis_url, postgres_url),
            f"--nats-url={nats_url}",
        ]
    )

    for row in (
        "Postgres + Redis",
        "SQLite + Redis",
        "Postgres + Postgres NOTIFY",
        "SQLite + NATS",
    ):
        assert f"| {row} |" in report
    assert "| Postgres, bare psycopg (floor) |" in report
    for column in ("own tx chains/s", "caller tx chains/s", "own tx, 3 tasks chains/s"):
        assert column in report
    assert "100/tx chains/s" in report
    assert "NATS 2." in report  # the server version is in the notes


async def test_drain_reports_jobs_per_second_for_both_worker_modes(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "drain",
            "--rounds=1",
            "--jobs=30",
            "--modes=atomic,staged,atomic-session",
            "--state=sqlite",
            "--notify=in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + in-process, atomic, 30 jobs |" in report
    assert "| SQLite + in-process, staged, 30 jobs |" in report
    assert "| SQLite + in-process, atomic-session, 30 jobs |" in report


async def test_drain_reports_jobs_per_second_with_and_without_opentelemetry(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "drain",
            "--rounds=1",
            "--jobs=30",
            "--modes=staged",
            "--instrumentation=none,otel",
            "--state=sqlite",
            "--notify=in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + in-process, staged, 30 jobs |" in report
    assert "| SQLite + in-process, staged, 30 jobs, otel |" in report


async def test_instrumentation_cost_reports_microseconds_per_run_for_every_variant() -> None:
    report = await run_benchmark(["instrumentation-cost", "--rounds=1", "--runs=50"])

    for variant in (
        "none",
        "otel-api",
        "otel-sdk-spans",
        "otel-sdk-metrics",
        "otel-sdk",
        "otel-sdk-spans-unsampled",
    ):
        assert f"| {variant} |" in report
    assert "µs per run" in report and "µs per start_chains" in report


async def test_prune_impact_reports_claim_latency_idle_and_while_pruning(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "prune-impact",
            "--rounds=1",
            "--finished=3000",
            "--jobs=100",
            "--state=sqlite,postgres",
            "--notify=in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + in-process, idle |" in report
    assert "| Postgres + in-process, pruning |" in report
    assert "Pruning / idle:" in report


async def test_limits_reports_each_limit_side_by_side_with_the_plain_drain(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "limits",
            "--rounds=1",
            "--jobs=30",
            "--keys=5",
            "--state=sqlite",
            "--notify=in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + in-process, plain |" in report
    assert "| SQLite + in-process, limits not binding |" in report
    assert "| SQLite + in-process, key_concurrency=1, 5 keys |" in report
    assert "time vs plain" in report


async def test_limited_claim_reports_each_limit_against_the_plain_claim(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "limited-claim",
            "--rounds=1",
            "--claims=5",
            "--batch=3",
            "--jobs=40",
            "--state=postgres,sqlite",
            "--notify=in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    for state in ("Postgres", "SQLite"):
        assert f"| {state} + in-process, plain |" in report
        assert f"| {state} + in-process, concurrency |" in report
        assert f"| {state} + in-process, concurrency + rate |" in report
    assert "p50 vs plain" in report


async def test_steady_state_reports_rates_latency_and_backlog(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "steady",
            "--rounds=1",
            "--duration=1",
            "--rate=30",
            "--producers=2",
            "--workers=2",
            "--state=postgres",
            "--notify=redis",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| Postgres + Redis |" in report
    assert "2 producer tasks (30 chains/s offered" in report
    for column in ("started/s", "completed/s", "p99 ms", "backlog at end"):
        assert column in report


async def test_wake_latency_reports_percentiles_with_and_without_notifications(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "wake-latency",
            "--rounds=1",
            "--samples=5",
            "--noop-samples=2",
            "--noop-poll-interval=0.2",
            "--state=sqlite",
            "--notify=noop,in-process",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + noop (poll 0.2 s) |" in report
    assert "| SQLite + in-process |" in report
    assert "p99 ms" in report


async def test_wake_path_reports_each_step_of_a_wakeup(redis_url: str, postgres_url: str) -> None:
    report = await run_benchmark(
        [
            "wake-path",
            "--rounds=1",
            "--samples=5",
            "--state=sqlite",
            "--notify=in-process,redis",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "| SQLite + in-process |" in report
    assert "| SQLite + Redis |" in report
    # A step appears only when every sample reached it.
    for step in ("committed", "announced", "budget granted", "claim called", "claimed", "handler"):
        assert f"{step} ms" in report


async def test_herd_counts_claims_and_the_workers_that_made_them(
    redis_url: str, postgres_url: str, nats_url: str
) -> None:
    report = await run_benchmark(
        [
            "herd",
            "--rounds=1",
            "--workers=4",
            "--jobs=2",
            "--settle=0.1",
            "--noop-poll-interval=0.2",
            "--state=postgres",
            "--notify=noop,redis,postgres,nats",
            *_services(redis_url, postgres_url),
            f"--nats-url={nats_url}",
        ]
    )

    for row in ("noop (poll 0.2 s)", "Redis", "Postgres NOTIFY", "NATS"):
        assert f"| Postgres + {row} |" in report
    assert "claims per job" in report
    assert "workers that claimed" in report


@pytest.mark.parametrize("postgres", [True, False], ids=["postgres", "sqlite"])
def test_herd_recognises_the_claim_statement_and_nothing_else(postgres: bool) -> None:
    from sqlalchemy.dialects import postgresql, sqlite

    from benchmarks.herd import is_claim
    from state_adapters.postgres.database import PostgresSql
    from state_adapters.schema import make_tables
    from state_adapters.sqlite.database import SqliteSql
    from state_adapters.statements.queue import Statements

    sql = Statements(make_tables("smoke_"), PostgresSql() if postgres else SqliteSql())
    dialect = postgresql.psycopg.dialect() if postgres else sqlite.aiosqlite.dialect()

    def compiled(statement: object) -> str:
        return str(statement.compile(dialect=dialect))  # type: ignore[attr-defined]

    now = datetime.now(UTC)
    claim = sql.claim(["a", "b"], worker_id="w", leased_until=now, limit=10, now=now)
    assert is_claim(compiled(claim.statement), None)
    assert not is_claim(compiled(sql.next_due_at(["a"]).statement), None)


async def test_redis_cost_counts_round_trips_on_a_private_server(postgres_url: str) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-cost starts its own redis-server, which is not installed")
    report = await run_benchmark(
        [
            "redis-cost",
            "--rounds=1",
            "--drain-jobs=5",
            "--state=sqlite",
            f"--postgres-url={postgres_url}",
        ]
    )

    assert "| own tx, 3 chains of 3 types |" in report
    assert "| caller tx, 3 start_chain calls of 3 types |" in report
    assert "commands executed" in report
    assert "sent EVALSHA x1; executed EVALSHA x1" in report


async def test_wake_modes_reports_pubsub_and_lists_side_by_side(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "wake-modes",
            "--rounds=1",
            "--samples=3",
            "--workers=3",
            "--jobs=6",
            "--restart-chains=2",
            *_services(redis_url, postgres_url),
        ]
    )

    assert "(wake='pubsub')" in report and "(wake='lists')" in report
    for figure in ("wake p99 ms", "claims per job", "wakeups lost", "connections", "bytes"):
        assert figure in report


async def test_dashboard_reports_every_page_on_both_databases(postgres_url: str) -> None:
    report = await run_benchmark(
        [
            "dashboard",
            "--rounds=1",
            "--requests=2",
            "--finished=300",
            "--pending=20",
            f"--postgres-url={postgres_url}",
        ]
    )

    for database in ("Postgres", "SQLite"):
        for page in ("overview", "chains, first page", "chains, search by dedup key"):
            assert f"| {database}, {page} |" in report


async def test_dashboard_write_cost_compares_with_and_without_its_indexes() -> None:
    report = await run_benchmark(
        ["dashboard", "--rounds=1", "--write-cost-jobs=20", "--state=sqlite"]
    )

    assert "| SQLite, with the dashboard's indexes |" in report
    assert "| SQLite, without the dashboard's indexes |" in report
    assert "| SQLite: with / without |" in report


@pytest.mark.slow
@pytest.mark.timeout(300)  # twenty driver processes, each with a database of its own
async def test_peers_runs_every_workload_for_ours_and_the_floors(
    redis_url: str, postgres_url: str, nats_url: str
) -> None:
    # Over 20 s on a loaded machine, justified: each of the twenty sides is a driver
    # process of its own (~1 s of imports) with a database created and dropped for it,
    # and no flag leaves out a side without leaving its row untested.
    # Ours only: the peers' sides need virtualenvs installed from PyPI (network, a
    # minute or two the first time, and Python 3.12 for Oban), which CI cannot count on;
    # their drivers run in `python -m benchmarks peers` itself (docs/benchmarks.md).
    report = await run_benchmark(
        [
            "peers",
            "--rounds=1",
            "--peers=",
            "--calls=5",
            "--batches=1",
            "--samples=3",
            "--jobs=40",
            "--processes=2",
            *_services(redis_url, postgres_url),
            f"--nats-url={nats_url}",
        ]
    )

    for row in (
        "queuert-notify, Postgres + noop",
        "bare psycopg (floor)",
        "queuert-notify, SQLite + in-process",
        "bare sqlite3 (floor)",
        "queuert-notify, Postgres + Redis, 2 processes",
    ):
        assert f"| {row} |" in report
    for column in (
        "p50 / floor",
        "100/tx jobs/s",
        "p99 ms",
        "enqueue call p50 ms",
        "commit → handler p50 ms",
        "jobs/s",
        "queue CPU %",
        "queue CPU µs/job",
        "Postgres CPU µs/job",
    ):
        assert column in report


async def test_health_cost_reports_both_databases(postgres_url: str) -> None:
    report = await run_benchmark(
        [
            "health-cost",
            "--rounds=1",
            "--calls=3",
            "--finished=300",
            "--pending=20",
            f"--postgres-url={postgres_url}",
        ]
    )

    assert "| Postgres |" in report and "| SQLite |" in report
    assert "Postgres: ok: 20 pending" in report


async def test_claim_plan_compares_a_never_analyzed_table_with_an_analyzed_one(
    postgres_url: str,
) -> None:
    report = await run_benchmark(
        [
            "claim-plan",
            "--rounds=1",
            "--jobs=200",
            "--explains=3",
            f"--postgres-url={postgres_url}",
        ]
    )

    assert "| never analyzed |" in report and "| analyzed |" in report
    assert "never analyzed / analyzed, jobs/s:" in report
    assert "claim server µs/job" in report


@holds_the_horizon
async def test_held_horizon_reports_each_phase_and_the_health_report_at_the_worst_moment(
    postgres_url: str,
) -> None:
    report = await run_benchmark(
        [
            "held-horizon",
            # The report comes 4 s into the hold (by the server's clock), twice the
            # age at which it names the snapshot.
            "--duration=7",
            "--hold-at=1",
            "--hold-for=5",
            "--horizon-age=2",
            "--rate=50",
            f"--postgres-url={postgres_url}",
        ]
    )

    for phase in ("before the hold", "held", "after the release"):
        assert f"| {phase} |" in report
    assert "xmin horizon: backend" in report


async def test_session_enqueue_reports_start_chain_next_to_bare_inserts_per_driver_and_form(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        ["session-enqueue", "--rounds=1", "--transactions=8", *_services(redis_url, postgres_url)]
    )

    for row in (
        "psycopg, AsyncSession",
        "psycopg, AsyncConnection",
        "asyncpg, AsyncSession",
        "asyncpg, AsyncConnection",
    ):
        assert f"| {row} |" in report
    for column in ("start_chain / driver INSERT", "start_chain / queue statement"):
        assert column in report


def test_django_enqueue_reports_create_and_enqueue_per_database(
    redis_url: str, postgres_url: str
) -> None:
    report = _django_enqueue(redis_url, postgres_url)
    assert "| database | create() µs | enqueue() µs | enqueue / create |" in report
    assert "| Postgres (psycopg 3) |" in report
    assert "| Postgres (psycopg2) |" in report
    assert "| SQLite |" in report


def test_django_enqueue_runs_a_baseline_checkout_beside_this_one(
    redis_url: str, postgres_url: str
) -> None:
    root = Path(__file__).resolve().parent.parent
    report = _django_enqueue(
        redis_url, postgres_url, "--databases=postgres,psycopg2", f"--baseline={root}"
    )
    assert "| Postgres (psycopg 3) [baseline] |" in report
    assert "| Postgres (psycopg2) [baseline] |" in report
    assert f"This tree / the baseline ({root})" in report
    assert "| SQLite |" not in report


def _django_enqueue(redis_url: str, postgres_url: str, *options: str) -> str:
    pytest.importorskip("django")
    # A process of its own: the benchmark configures Django's process-wide settings.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "django-enqueue",
            "--rounds=1",
            "--transactions=20",
            *options,
            f"--redis-url={redis_url}",
            f"--postgres-url={postgres_url}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_pgbouncer_reports_wake_latency_per_route_and_the_fleets_server_connections(
    redis_url: str, postgres_url: str
) -> None:
    report = await run_benchmark(
        [
            "pgbouncer",
            "--rounds=1",
            "--samples=5",
            "--processes=2",
            "--concurrency=2",
            "--jobs=100",
            *_services(redis_url, postgres_url),
        ]
    )

    for row in ("psycopg, direct", "psycopg, PgBouncer", "asyncpg, direct", "asyncpg, PgBouncer"):
        assert f"| {row} |" in report
    assert "| asyncpg, 2 processes x 2 slots |" in report
    assert "server connections (max)" in report


_MUST_BE_ZERO = (
    "lost",
    "completed twice",
    "effects missing",
    "over a cap",
    "ticks started twice",
    "ran before its blocker",
    "unfinished jobs left",
)


def _table_cells(report: str) -> list[dict[str, str]]:
    """Every row of every markdown table in ``report``, as column name -> cell."""
    cells: list[dict[str, str]] = []
    header: list[str] = []
    for line in report.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        values = [value.strip() for value in line.strip("|").split("|")]
        if not header:
            header = values
        elif not line.startswith("|---"):
            cells.append(dict(zip(header, values, strict=True)))
    return cells


@pytest.mark.slow
@pytest.mark.timeout(300)  # every scenario starts and kills worker processes on both databases
async def test_churn_loses_no_job_completes_none_twice_and_holds_every_cap(
    postgres_url: str,
) -> None:
    # Over 20 s, justified: each of the nine scenarios starts, SIGKILLs and stops worker
    # processes (and a private Redis, twice): the time is theirs, not the jobs' (--scale=0.01).
    if shutil.which("redis-server") is None:
        pytest.skip("churn starts and kills its own redis-server, which is not installed")
    report = await run_benchmark(
        ["churn", "--scale=0.01", "--seed=1", f"--postgres-url={postgres_url}"]
    )

    rows = _table_cells(report)
    labels = [row.get("state") or row.get("state + notify") for row in rows]
    assert labels == [
        *("Postgres", "SQLite"),
        *("Postgres + redis", "Postgres + redis-lists", "SQLite + in-process"),
        *("Postgres", "SQLite") * 2,
    ]
    for row in rows:
        for column in _MUST_BE_ZERO:
            if column in row:
                assert row[column] == "0", (column, row)
    ticks = [int(row["ticks started"]) for row in rows if "ticks started" in row]
    assert ticks and min(ticks) >= 2
    redis_restarts = [row["Redis restarts"] for row in rows if row.get("Redis restarts")]
    assert redis_restarts == ["2", "2", "0"]
