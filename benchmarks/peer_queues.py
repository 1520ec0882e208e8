"""Issues #17 and #28: queuert-notify side by side with the queues users would pick instead.

pgqueuer, procrastinate, chancy, awa and Oban for Python run from virtualenvs
the benchmark makes (``benchmarks/peers/venvs.py``: Oban's from Python 3.12 or
later, skipped with a note in the report when there is none), so the product
never depends on them. Each peer runs in two configurations its driver names
(``--config``): its documented defaults, and matched to ours at
``--concurrency``; the enqueue, batch and wake workloads run each peer at its
defaults, the drain runs both (one row where they are the same worker). Every
side is a driver script in ``benchmarks/peers/`` run as a subprocess per round
(ours and the bare-driver floor from this interpreter, the peers from their
virtualenvs); the workloads and
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
  the handler's first line, split into the call and its return (commit) to the
  handler, ``--samples`` per round;
- ``drain``: ``--jobs`` no-op jobs (each size in turn) filled and analyzed,
  then one worker process drains them; ours also with ``claim_ahead=True`` (its
  documented setting for many short jobs) and with ``--processes`` worker
  processes under ``queuert-notify worker --processes``; with the CPU per job
  of the queue's processes and of the Postgres backends serving the round's
  database, and what the whole machine used meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from benchmarks import runner, services
from benchmarks.peers import venvs

NAME = "peers"
HELP = "ours vs pgqueuer, procrastinate, chancy, awa and Oban: enqueue, wake latency, drain"

_ROOT = Path(__file__).resolve().parent.parent
_DRIVERS = Path(__file__).resolve().parent / "peers"
PEERS = ("pgqueuer", "procrastinate", "chancy", "awa", "oban")
WORKLOADS = ("enqueue", "batch", "wake", "drain")
CONFIGS = ("defaults", "matched")

_PEER_NAME = {
    "pgqueuer": "pgqueuer 1.6",
    "procrastinate": "procrastinate 3.10",
    "chancy": "chancy 0.26",
    "awa": "awa 0.6.9",
    "oban": "Oban for Python 0.7",
}
# What each configuration of each driver means (its docstring says why).
_DEFAULTS = {
    "pgqueuer": "batch 10, no cap",
    "procrastinate": "concurrency 1",
    "chancy": "concurrency 100",
    "awa": "10 workers",
    "oban": "limit 10",
}
# Peers whose defaults are concurrency 10: at --concurrency 10 both configurations
# are the same worker, run once.
_DEFAULT_CONCURRENCY = {"awa": 10, "oban": 10}
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
        help="comma-separated async Postgres drivers of ours' enqueue, batch and drain rows: "
        "psycopg, asyncpg",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="a checkout of another commit: ours' enqueue, batch and Postgres drain rows also "
        "run from it, alternating with this tree's",
    )
    parser.add_argument("--venv", default=str(_ROOT / ".bench-peers"))
    parser.add_argument("--oban-venv", default=str(_ROOT / ".bench-oban"))
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
    root: Path = _ROOT
    """The checkout the driver runs from (``--baseline``: another commit's)."""


def _ours(
    state: str,
    notify: str,
    args: argparse.Namespace,
    processes: int = 1,
    driver: str = "psycopg",
    claim_ahead: bool = False,
) -> Side:
    database = _OURS_STATE[state] + (f" ({driver})" if driver != "psycopg" else "")
    name = f"queuert-notify, {database} + {_OURS_NOTIFY[notify]}"
    if processes > 1:
        name += f", {processes} processes"
    if claim_ahead:
        name += ", claim_ahead=True"
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
        *(("--claim-ahead",) if claim_ahead else ()),
    )
    return Side(name, command, postgres=state == "postgres", sqlalchemy_url=True)


def _shown(path: str) -> str:
    """``path`` as a report shows it: relative to the checkout when it lies inside it,
    so that a report read elsewhere names no machine's folders."""
    try:
        return str(Path(path).relative_to(_ROOT))
    except ValueError:
        return path


def _baseline(side: Side, root: str) -> Side:
    """``side`` run from the checkout at ``root`` (``--baseline``), alternating with this
    tree's."""
    return replace(side, name=f"{side.name} [baseline]", root=Path(root))


def _floor(kind: str) -> Side:
    name = "bare psycopg (floor)" if kind == "psycopg" else "bare sqlite3 (floor)"
    command = (sys.executable, "-m", "benchmarks.peers.floor_side", f"--kind={kind}")
    return Side(name, command, postgres=kind == "psycopg")


def _peer(peer: str, config: str, python: str, concurrency: int) -> Side:
    if _DEFAULT_CONCURRENCY.get(peer) == concurrency:
        label = f"defaults = matched ({_DEFAULTS[peer]})"
    elif config == "defaults":
        label = f"defaults ({_DEFAULTS[peer]})"
    elif peer == "pgqueuer":
        half = max(1, concurrency // 2)
        label = f"matched (batch {half}, cap {2 * half})"
    else:
        label = f"matched (concurrency {concurrency})"
    command = (python, str(_DRIVERS / f"{peer}_side.py"), f"--config={config}")
    return Side(f"{_PEER_NAME[peer]}, {label}", command)


@dataclass(frozen=True)
class Peers:
    """The peer sides of a run, at their defaults and matched, and what was skipped."""

    defaults: list[Side]
    matched: list[Side]
    pythons: list[str]
    skipped: list[str]


async def peer_sides(peers: list[str], args: argparse.Namespace) -> Peers:
    """The sides of ``peers``, their virtualenvs made first (Oban's skipped, with the
    reason, when no Python 3.12 or later is found)."""
    defaults: list[Side] = []
    matched: list[Side] = []
    pythons: list[str] = []
    skipped: list[str] = []
    shared = [peer for peer in peers if peer != "oban"]
    pythons_by_peer = {}
    if shared:
        python = await asyncio.to_thread(
            venvs.ensure, Path(args.venv), venvs.REQUIREMENTS, sys.executable
        )
        pythons.append(python)
        pythons_by_peer.update(dict.fromkeys(shared, python))
    if "oban" in peers:
        base, looked = await asyncio.to_thread(venvs.python_for_oban)
        if base is None:
            skipped.append(
                f"Oban for Python skipped: it needs Python 3.12 or later and none was found "
                f"(looked in {looked}); install one, e.g. `pyenv install 3.12`"
            )
            print(skipped[-1], file=sys.stderr)
        else:
            python = await asyncio.to_thread(
                venvs.ensure, Path(args.oban_venv), venvs.OBAN_REQUIREMENTS, base
            )
            pythons.append(python)
            pythons_by_peer["oban"] = python
    for peer in peers:
        if peer not in pythons_by_peer:
            continue
        python = pythons_by_peer[peer]
        defaults.append(_peer(peer, "defaults", python, args.concurrency))
        if _DEFAULT_CONCURRENCY.get(peer) != args.concurrency:
            matched.append(_peer(peer, "matched", python, args.concurrency))
    return Peers(defaults, matched, pythons, skipped)


def _admin_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


def _database_url(url: str, database: str, *, sqlalchemy: bool) -> str:
    parsed = make_url(url).set(database=database)
    if not sqlalchemy:
        parsed = parsed.set(drivername="postgresql")
    return parsed.render_as_string(False)


async def run_side(side: Side, workload: list[str], args: argparse.Namespace) -> runner.Figures:
    """One round: a fresh database, the driver's run of ``workload``, the database dropped."""
    slug = re.sub(r"[^a-z0-9]+", "_", side.name.lower())[:20]
    database = f"{services.unique_prefix()}_{slug}"
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
            cwd=side.root,
            env={**os.environ, "PYTHONPATH": str(side.root)},
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
    rows = results.all_medians()
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
    found = await peer_sides(peers, args)
    defaults = found.defaults
    pgqueuer = next((side.name for side in defaults if side.name.startswith("pgqueuer")), "")
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
        baseline = (
            [] if args.baseline is None else [_baseline(side, args.baseline) for side in postgres]
        )
        sides = [
            *postgres,
            *baseline,
            pg_floor,
            *defaults,
            *sqlite,
            *([lite_floor] if sqlite else []),
        ]

        def floor_ratios(column: str, figure: str) -> list[tuple[str, str, str, str]]:
            return (
                [
                    (column, side.name, pg_floor.name, figure)
                    for side in [*postgres, *baseline, *defaults]
                ]
                + [(column, side.name, lite_floor.name, figure) for side in sqlite]
                + [
                    (f"{figure} / baseline", side.name, before.name, figure)
                    for side, before in zip(postgres, baseline, strict=False)
                ]
            )

        if "enqueue" in workloads:
            sections.append(
                await _compare(
                    f"Enqueue one job per call, each in its own transaction ({args.calls:,} "
                    "calls per round after 50 untimed); peers at their defaults:",
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
                    f"({args.batches} transactions per round); peers at their defaults:",
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
        ratios = [
            (column, side.name, pgqueuer, figure)
            for side in ours
            for column, figure in (
                ("p50 / pgqueuer", "p50 ms"),
                ("commit → handler / pgqueuer", "commit → handler p50 ms"),
            )
        ]
        sections.append(
            await _compare(
                f"Wake latency, enqueue call to the handler's first line, and its part from "
                f"the call's return (commit) to the handler; one idle worker (ours at "
                f"concurrency 1, peers at their defaults), {args.samples} jobs per round, "
                f"random gaps {args.min_gap * 1000:g} to {args.max_gap * 1000:g} ms "
                "(medians over rounds of each round's percentiles):",
                [*ours, *defaults],
                [
                    "wake",
                    f"--samples={args.samples}",
                    f"--min-gap={args.min_gap}",
                    f"--max-gap={args.max_gap}",
                ],
                args,
                ratios,
            )
        )

    if "drain" in workloads:
        for jobs in (int(size) for size in _list(args.jobs)):
            reference = _ours("postgres", "redis", args)
            ours = [reference]
            ours += [
                _ours("postgres", "redis", args, driver=driver)
                for driver in _list(args.ours_drivers)
                if driver != "psycopg"
            ]
            ours.append(_ours("postgres", "redis", args, claim_ahead=True))
            ours += [
                _ours("postgres", "redis", args, int(n))
                for n in _list(args.processes)
                if int(n) > 1
            ]
            if args.sqlite:
                ours.append(_ours("sqlite", "in-process", args))
            if args.baseline is not None:
                ours += [_baseline(side, args.baseline) for side in ours if side.postgres]
            sections.append(await _drain_section(ours, found, jobs, args, reference.name))

    notes = [
        "each side runs as a subprocess per round (ours and the floors from this "
        "interpreter, the peers from "
        + (", ".join(_shown(python) for python in found.pythons) or "their virtualenvs")
        + "), with a Postgres database of its own created for the round and dropped after "
        "it; timings are taken inside the driver (benchmarks/peers/workloads.py), so "
        "interpreter start, imports and schema installation are not counted",
        "peers' configurations are in the docstrings of benchmarks/peers/<peer>_side.py",
        *found.skipped,
        f"Postgres {await services.postgres_server_version(args.postgres_url)}, Redis "
        f"{await services.redis_server_version(args.redis_url)} on the same host",
        runner.machine_notes(),
    ]
    return runner.report(
        "Side by side with pgqueuer, procrastinate, chancy, awa and Oban for Python",
        [f"Medians of {args.rounds} alternating rounds.", *sections],
        notes=notes,
    )


async def _drain_section(
    ours: list[Side], peers: Peers, jobs: int, args: argparse.Namespace, reference: str
) -> str:
    sides = [*ours, *peers.defaults, *peers.matched]
    workload = ["drain", f"--jobs={jobs}", f"--concurrency={args.concurrency}"]
    results = await runner.alternate(_variants(sides, workload, args), args.rounds, warmup=0)
    rows = results.all_medians()
    for side in sides[1:]:
        rows[side.name]["ours (Postgres + Redis, 1 process) / this"] = results.ratio(
            reference, side.name
        )["jobs/s"]
    for side in ours:
        before = f"{side.name} [baseline]"
        if before in rows:
            # Per-round pairs: this tree's round i against the baseline's round i.
            rows[side.name]["queue CPU / baseline"] = results.ratio(side.name, before)[
                "queue CPU µs/job"
            ]
    best = [
        _against_best(rows, reference, label, group)
        for label, group in (("at its defaults", peers.defaults), ("matched", peers.matched))
        if group
    ]
    return (
        f"Drain of {jobs:,} no-op jobs, one worker process (ours at concurrency "
        f"{args.concurrency}, also with more processes; each peer at its defaults and "
        f"matched at concurrency {args.concurrency}), from the worker's start to the last "
        "completion recorded; CPU per job of the queue's processes and of the Postgres "
        "backends serving the round's database:\n\n"
        + runner.table(rows, first_column="queue")
        + "".join(f"\n\n{line}" for line in best)
    )


def _against_best(
    rows: dict[str, runner.Figures], reference: str, label: str, group: list[Side]
) -> str:
    """Ours against the fastest peer of ``group`` and the one with the least CPU per job
    (from the medians)."""
    ours = rows[reference]
    fastest = max(group, key=lambda side: rows[side.name]["jobs/s"]).name
    leanest = min(group, key=lambda side: rows[side.name]["queue CPU µs/job"]).name
    return (
        f"Best peer {label}: {fastest}, {rows[fastest]['jobs/s']:,.0f} jobs/s; ours "
        f"(Postgres + Redis, 1 process) {ours['jobs/s'] / rows[fastest]['jobs/s']:.2f} times it. "
        f"Least queue CPU per job {label}: {leanest}, "
        f"{rows[leanest]['queue CPU µs/job']:,.0f} µs; ours "
        f"{ours['queue CPU µs/job'] / rows[leanest]['queue CPU µs/job']:.2f} times it."
    )
