"""Issue #17: queuert-notify side by side with the queues users would pick instead.

pgqueuer, procrastinate and chancy run from a virtualenv of their own
(``--venv``, default ``.bench-peers/``, created from
``benchmarks/peers-requirements.txt`` when missing or when that file changed),
so the product never depends on them. Every side is a driver script in
``benchmarks/peers/`` run as a subprocess per round (ours and the bare-driver
floor from this interpreter, the peers from that virtualenv); the workloads and
their timing are the same code for all (``benchmarks/peers/workloads.py``).
Each round of each side gets a Postgres database of its own, created for it
and dropped afterwards (SQLite sides: a temporary file).

Workloads (``--workloads``):

- ``enqueue``: ``--calls`` jobs enqueued one per call, each in its own
  transaction; per-call percentiles and calls/s, and the p50 against the
  floor of the same database (bare psycopg BEGIN/INSERT/COMMIT, bare sqlite3);
- ``batch``: ``--batches`` transactions of 100 jobs with each queue's batch
  call, against ``executemany`` (psycopg) or sqlite3's;
- ``wake``: one idle worker, a job enqueued after a random gap of
  ``--min-gap``..``--max-gap``; latency from the start of the enqueue call to
  the handler's first line, ``--samples`` per round;
- ``drain``: ``--jobs`` no-op jobs (each size in turn) filled and analyzed,
  then one worker process at ``--concurrency`` 10 drains them; ours also with
  ``--processes`` worker processes under ``queuert-notify worker --processes``,
  with the CPU those processes used and what the whole machine used meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from benchmarks import runner, services

NAME = "peers"
HELP = "ours vs pgqueuer, procrastinate and chancy: enqueue, wake latency, drain"

_ROOT = Path(__file__).resolve().parent.parent
_DRIVERS = Path(__file__).resolve().parent / "peers"
REQUIREMENTS = Path(__file__).resolve().parent / "peers-requirements.txt"
PEERS = ("pgqueuer", "procrastinate", "chancy")
WORKLOADS = ("enqueue", "batch", "wake", "drain")

_PEER_CONFIG = {
    "pgqueuer": "pgqueuer 1.6 (asyncpg, LISTEN/NOTIFY)",
    "procrastinate": "procrastinate 3.10 (psycopg connector)",
    "chancy": "chancy 0.26 (defaults, AsyncExecutor)",
}
_OURS_STATE = {"postgres": "Postgres", "sqlite": "SQLite"}
_OURS_NOTIFY = {
    "noop": "noop",
    "redis": "Redis",
    "postgres": "Postgres NOTIFY",
    "in-process": "in-process",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per side")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {WORKLOADS}"
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated peers; empty for ours only"
    )
    parser.add_argument("--calls", type=int, default=1000, help="enqueue calls per round")
    parser.add_argument("--batches", type=int, default=50, help="transactions of 100 per round")
    parser.add_argument("--samples", type=int, default=200, help="wake samples per round")
    parser.add_argument("--min-gap", type=float, default=0.010, help="seconds")
    parser.add_argument("--max-gap", type=float, default=0.050, help="seconds")
    parser.add_argument("--jobs", default="10000,50000", help="comma-separated drain sizes")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--processes",
        default="2",
        help="comma-separated process counts of ours' extra drain rows (empty: none)",
    )
    parser.add_argument(
        "--no-sqlite", dest="sqlite", action="store_false", help="skip ours on SQLite"
    )
    parser.add_argument(
        "--ours-drivers",
        default="psycopg",
        help="comma-separated async Postgres drivers of ours' enqueue and batch rows: "
        "psycopg, asyncpg",
    )
    parser.add_argument("--venv", default=str(_ROOT / ".bench-peers"))
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--nats-url", default=services.nats_url())


@dataclass(frozen=True)
class Side:
    """One contender: how to run its driver, and whether it needs a Postgres database."""

    name: str
    command: tuple[str, ...]
    postgres: bool = True
    sqlalchemy_url: bool = False


def _ours(
    state: str, notify: str, args: argparse.Namespace, processes: int = 1, driver: str = "psycopg"
) -> Side:
    database = _OURS_STATE[state] + (f" ({driver})" if driver != "psycopg" else "")
    name = f"queuert-notify, {database} + {_OURS_NOTIFY[notify]}"
    if processes > 1:
        name += f", {processes} processes"
    command = (
        sys.executable,
        "-m",
        "benchmarks.peers.ours_side",
        f"--state={state}",
        f"--notify={notify}",
        f"--redis-url={args.redis_url}",
        f"--nats-url={args.nats_url}",
        f"--processes={processes}",
        f"--driver={driver}",
    )
    return Side(name, command, postgres=state == "postgres", sqlalchemy_url=True)


def _floor(kind: str) -> Side:
    name = "bare psycopg (floor)" if kind == "psycopg" else "bare sqlite3 (floor)"
    command = (sys.executable, "-m", "benchmarks.peers.floor_side", f"--kind={kind}")
    return Side(name, command, postgres=kind == "psycopg")


def _peer(peer: str, python: str) -> Side:
    return Side(_PEER_CONFIG[peer], (python, str(_DRIVERS / f"{peer}_side.py")))


async def peers_python(venv: str) -> str:
    """The interpreter of the peers' virtualenv, created or refreshed when
    ``peers-requirements.txt`` changed since it was installed."""
    return await asyncio.to_thread(_ensure_venv, Path(venv))


def _ensure_venv(venv: Path) -> str:
    python = venv / "bin" / "python"
    stamp = venv / f".installed-{hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]}"
    if not stamp.exists():
        if not python.exists():
            _check(sys.executable, "-m", "venv", str(venv))
        _check(str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS))
        for old in venv.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return str(python)


def _check(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def _admin_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


def _database_url(url: str, database: str, *, sqlalchemy: bool) -> str:
    parsed = make_url(url).set(database=database)
    if not sqlalchemy:
        parsed = parsed.set(drivername="postgresql")
    return parsed.render_as_string(False)


async def run_side(side: Side, workload: list[str], args: argparse.Namespace) -> runner.Figures:
    """One round: a fresh database, the driver's run of ``workload``, the database dropped."""
    database = f"{services.unique_prefix()}_{side.command[-1].split('/')[-1][:12]}".replace(
        "-", "_"
    ).replace(".", "_")
    admin = None
    if side.postgres:
        admin = await psycopg.AsyncConnection.connect(
            _admin_conninfo(args.postgres_url), autocommit=True
        )
        await admin.execute(f'CREATE DATABASE "{database}"')  # type: ignore[arg-type]
    try:
        dsn = (
            _database_url(args.postgres_url, database, sqlalchemy=side.sqlalchemy_url)
            if side.postgres
            else "sqlite"
        )
        process = await asyncio.create_subprocess_exec(
            *side.command,
            *workload,
            f"--dsn={dsn}",
            cwd=_ROOT,
            env={**os.environ, "PYTHONPATH": str(_ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(
                f"{side.name} {' '.join(workload)} exited with {process.returncode}:\n"
                + err.decode(errors="replace")[-4000:]
            )
        figures: runner.Figures = json.loads(out.decode().strip().splitlines()[-1])
        return figures
    finally:
        if admin is not None:
            # Only the database this round created; FORCE ends a straggling connection.
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')  # type: ignore[arg-type]
            await admin.close()


def _variants(
    sides: list[Side], workload: list[str], args: argparse.Namespace
) -> list[runner.Variant]:
    def variant(side: Side) -> runner.Variant:
        async def one_round() -> runner.Figures:
            return await run_side(side, workload, args)

        return runner.Variant(side.name, one_round)

    return [variant(side) for side in sides]


async def _compare(
    title: str,
    sides: list[Side],
    workload: list[str],
    args: argparse.Namespace,
    ratios: list[tuple[str, str, str, str]],
) -> str:
    """Alternate ``sides`` over the rounds; a table of medians, then for each
    ``(column, numerator, denominator, figure)`` of ``ratios`` the median per-round
    ratio of that figure, added as ``column`` on the numerator's row."""
    results = await runner.alternate(_variants(sides, workload, args), args.rounds, warmup=0)
    rows = {side.name: results.medians(side.name) for side in sides}
    for column, numerator, denominator, figure in ratios:
        if numerator in rows and denominator in rows:
            rows[numerator][column] = results.ratio(numerator, denominator)[figure]
    return f"{title}\n\n" + runner.table(rows, first_column="queue")


def _list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


async def run(args: argparse.Namespace) -> str:
    workloads = _list(args.workloads)
    unknown = [w for w in workloads if w not in WORKLOADS]
    peers = _list(args.peers)
    unknown += [p for p in peers if p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown {unknown}; workloads: {WORKLOADS}, peers: {PEERS}")
    python = await peers_python(args.venv) if peers else ""
    peer_sides = [_peer(peer, python) for peer in peers]
    pgqueuer = _PEER_CONFIG["pgqueuer"]
    sections = []

    if "enqueue" in workloads or "batch" in workloads:
        pg_floor, lite_floor = _floor("psycopg"), _floor("sqlite3")
        postgres = [_ours("postgres", n, args) for n in ("noop", "redis", "postgres")]
        postgres += [
            _ours("postgres", n, args, driver=driver)
            for driver in _list(args.ours_drivers)
            if driver != "psycopg"
            for n in ("noop", "redis")
        ]
        sqlite = [_ours("sqlite", n, args) for n in ("noop", "in-process")] if args.sqlite else []
        sides = [*postgres, pg_floor, *peer_sides, *sqlite, *([lite_floor] if sqlite else [])]

        def floor_ratios(column: str, figure: str) -> list[tuple[str, str, str, str]]:
            return [
                (column, side.name, pg_floor.name, figure) for side in [*postgres, *peer_sides]
            ] + [(column, side.name, lite_floor.name, figure) for side in sqlite]

        if "enqueue" in workloads:
            sections.append(
                await _compare(
                    f"Enqueue one job per call, each in its own transaction ({args.calls:,} "
                    "calls per round after 50 untimed):",
                    sides,
                    ["enqueue", f"--calls={args.calls}"],
                    args,
                    floor_ratios("p50 / floor", "p50 ms"),
                )
            )
        if "batch" in workloads:
            sections.append(
                await _compare(
                    f"Enqueue 100 jobs per transaction with each queue's batch call "
                    f"({args.batches} transactions per round):",
                    sides,
                    ["batch", f"--batches={args.batches}"],
                    args,
                    floor_ratios("of floor", "100/tx jobs/s"),
                )
            )

    if "wake" in workloads:
        ours = [_ours("postgres", "redis", args), _ours("postgres", "postgres", args)]
        if args.sqlite:
            ours.append(_ours("sqlite", "in-process", args))
        sections.append(
            await _compare(
                f"Wake latency, enqueue call to the handler's first line; one idle worker, "
                f"{args.samples} jobs per round, random gaps {args.min_gap * 1000:g} to "
                f"{args.max_gap * 1000:g} ms (medians over rounds of each round's "
                "percentiles):",
                [*ours, *peer_sides],
                [
                    "wake",
                    f"--samples={args.samples}",
                    f"--min-gap={args.min_gap}",
                    f"--max-gap={args.max_gap}",
                ],
                args,
                [("p50 / pgqueuer", side.name, pgqueuer, "p50 ms") for side in ours],
            )
        )

    if "drain" in workloads:
        for jobs in (int(size) for size in _list(args.jobs)):
            reference = _ours("postgres", "redis", args)
            ours = [reference]
            ours += [
                _ours("postgres", "redis", args, int(n))
                for n in _list(args.processes)
                if int(n) > 1
            ]
            if args.sqlite:
                ours.append(_ours("sqlite", "in-process", args))
            sections.append(await _drain_section(ours, peer_sides, jobs, args, reference.name))

    notes = [
        "each side runs as a subprocess per round (ours and the floors from this "
        "interpreter, the peers from " + (python or "their virtualenv") + "), with a "
        "Postgres database of its own created for the round and dropped after it; timings "
        "are taken inside the driver (benchmarks/peers/workloads.py), so interpreter "
        "start, imports and schema installation are not counted",
        "peers' configurations are in the docstrings of benchmarks/peers/<peer>_side.py",
        f"Postgres {await services.postgres_server_version(args.postgres_url)}, Redis "
        f"{await services.redis_server_version(args.redis_url)} on the same host",
        runner.machine_notes(),
    ]
    return runner.report(
        "Side by side with pgqueuer, procrastinate and chancy",
        [f"Medians of {args.rounds} alternating rounds.", *sections],
        notes=notes,
    )


async def _drain_section(
    ours: list[Side], peers: list[Side], jobs: int, args: argparse.Namespace, reference: str
) -> str:
    sides = [*ours, *peers]
    workload = ["drain", f"--jobs={jobs}", f"--concurrency={args.concurrency}"]
    results = await runner.alternate(_variants(sides, workload, args), args.rounds, warmup=0)
    rows = {side.name: results.medians(side.name) for side in sides}
    for side in sides[1:]:
        rows[side.name]["ours (Postgres + Redis, 1 process) / this"] = results.ratio(
            reference, side.name
        )["jobs/s"]
    return (
        f"Drain of {jobs:,} no-op jobs, one worker process at concurrency "
        f"{args.concurrency} (ours also with more processes), from the worker's start to "
        "the last completion recorded:\n\n" + runner.table(rows, first_column="queue")
    )
