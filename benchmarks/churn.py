"""Chaos runs with real worker processes (:mod:`benchmarks.chaos_app`): SIGKILLs, a Redis
killed and restarted, limits changed mid-run, schedules and a 0.2 s retention, counting
what a user relies on -- no job lost, none completed twice, no cap exceeded, no schedule
tick started twice.

Scenarios (``--scenarios``):

- ``supervised``: ``queuert-notify worker --processes 3`` (8 slots each, atomic handlers),
  one child SIGKILLed every 3-5 s, the type's limits (concurrency, key_concurrency, rate)
  changed three times as the run goes.
- ``churn``: 3 worker processes (staged handlers), one SIGKILLed and replaced every 2-4 s,
  the run's private redis-server killed and restarted twice: Postgres + Redis Pub/Sub,
  Postgres + Redis lists, SQLite + in-process.
- ``schedules``: 3 worker processes carrying an every-1 s schedule, one SIGKILLed and
  restarted half-way.
- ``retention``: 3 worker processes pruning chains finished 0.2 s ago while chains of 3
  steps (continuations) are started with dependents waiting on them (blockers), some
  started as the blocker finishes.

Every loop is bounded in count and time; everything runs on 127.0.0.1 under a table
prefix of the run's own (dropped afterwards), and every process started is killed on exit.
``--scale`` shrinks job counts and durations (the smoke test runs at 0.02).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks import runner, services, stacks
from benchmarks.chaos_app import TYPE_NAME, effects_table
from benchmarks.chaos_counts import (
    Limits,
    cap_text,
    doubled_and_reruns,
    most_claims_per_second,
    most_per_key,
    most_running,
    table,
)
from benchmarks.chaos_processes import Processes
from queuert_notify import ChainNotFoundError
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.notify.noop import NoopNotifyAdapter

NAME = "churn"
HELP = "chaos runs with SIGKILLed worker processes: lost, doubled, over-cap jobs and ticks"

SCENARIOS = ("supervised", "churn", "schedules", "retention")
_KEYS = 20
_PHASES = ((12, 2, None), (6, 1, 40), (16, 3, 80), (10, 2, 60))
"""(concurrency, key_concurrency, rate per second) set at the start and after each quarter."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=float, default=1.0, help="job counts and durations")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--state", default="postgres,sqlite", help="postgres, sqlite")
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--seed", type=int, default=None, help="for the kill timing")


@dataclass
class Database:
    """Fresh queue tables (and the app's effects table) under a prefix of the run's own."""

    kind: str
    url: str
    table_prefix: str
    engine: AsyncEngine
    client: Client
    effects: Any
    jobs: Any

    def env(self) -> dict[str, str]:
        return {"QT_DATABASE_URL": self.url, "QT_TABLE_PREFIX": self.table_prefix}

    async def rows(self) -> list[Any]:
        async with self.engine.connect() as conn:
            return list((await conn.execute(select(self.effects))).all())

    async def counts(self) -> dict[str, int]:
        return dict(await self.client.count_jobs(type_names=[TYPE_NAME]))


@asynccontextmanager
async def database(kind: str, args: argparse.Namespace) -> AsyncIterator[Database]:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    table_prefix = f"{services.unique_prefix()}_"
    workdir = tempfile.mkdtemp(prefix="queuert-churn-")
    url = f"sqlite+aiosqlite:///{workdir}/jobs.db" if kind == "sqlite" else args.postgres_url
    engine = create_async_engine(url)
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        await state.migrate()
        effects = effects_table(table_prefix)
        async with engine.begin() as conn:
            await conn.run_sync(effects.create)
        async with Client(state=state, notify=NoopNotifyAdapter()) as client:
            yield Database(kind, url, table_prefix, engine, client, effects, state.tables.jobs)
    finally:
        if kind == "postgres":
            async with engine.begin() as conn:
                await conn.run_sync(stacks.drop_prefixed, table_prefix)
        await engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)


async def _fill(db: Database, total: int, keyed: bool) -> None:
    for first in range(0, total, 500):
        await db.client.start_chains(
            [
                ChainSpec(
                    TYPE_NAME,
                    {"sleep": round(random.uniform(0.02, 0.3), 3)},
                    concurrency_key=f"k{n % _KEYS}" if keyed else None,
                )
                for n in range(first, min(total, first + 500))
            ]
        )


async def _until_done(db: Database, total: int, deadline: float) -> int:
    """Wait (bounded) until ``total`` jobs completed; the number completed."""
    while True:
        completed = (await db.counts()).get("completed", 0)
        if completed >= total or time.monotonic() > deadline:
            return completed
        await asyncio.sleep(0.5)


def _label(kind: str) -> str:
    return stacks.label(kind, "noop").split(" + ")[0]


async def supervised(db: Database, total: int, log_dir: Path) -> dict[str, object]:
    phases: list[Limits] = []

    async def set_phase(index: int) -> None:
        concurrency, key_concurrency, rate = _PHASES[index]
        per = None if rate is None else dt.timedelta(seconds=1)
        await db.client.set_limits(
            TYPE_NAME, concurrency=concurrency, key_concurrency=key_concurrency, rate=rate, per=per
        )
        phases.append(Limits(time.time(), concurrency, key_concurrency, rate))

    await set_phase(0)
    await _fill(db, total, keyed=True)
    sampled = 0
    kills = 0
    with Processes({**db.env(), "QT_MODE": "atomic", "QT_LEASE": "5"}, log_dir) as procs:
        supervisor = procs.start_worker(3, QT_CONCURRENCY="8")
        deadline = time.monotonic() + 120 + total / 5
        next_kill = time.monotonic() + random.uniform(3, 5)
        completed = 0
        while completed < total and time.monotonic() < deadline:
            counts = await db.counts()
            completed = counts.get("completed", 0)
            sampled = max(sampled, counts.get("running", 0))
            if len(phases) < len(_PHASES) and completed >= total * len(phases) / len(_PHASES):
                await set_phase(len(phases))
            if time.monotonic() >= next_kill:
                kills += procs.kill_child(supervisor, kills)
                next_kill = time.monotonic() + random.uniform(3, 5)
            await asyncio.sleep(0.25)
        codes = procs.stop_workers()
    rows = await db.rows()
    doubled, _ = doubled_and_reruns(rows, procs.killed, atomic=True)
    most, cap, over = most_running(rows, phases)
    key_most, key_cap, key_over = most_per_key(rows, phases)
    rate_most, rate_cap, rate_over = most_claims_per_second(rows, phases)
    return {
        "jobs started": total,
        "completed": completed,
        "lost": total - completed,
        "completed twice": doubled,
        "effects missing": completed - len({row.job_id for row in rows}),
        "completed on a later attempt": _later_attempts(rows),
        "children killed": kills,
        "limit changes": len(phases) - 1,
        "max running / cap": cap_text(most, cap),
        "running sampled (max)": sampled,
        "max per key / cap": cap_text(key_most, key_cap),
        "max claims in 1 s / rate": cap_text(rate_most, rate_cap),
        "over a cap": over + key_over + rate_over,
        "supervisor exit": codes[0],
    }


async def churn(db: Database, notify: str, total: int, log_dir: Path) -> dict[str, object]:
    await _fill(db, total, keyed=False)
    env = {**db.env(), "QT_MODE": "staged", "QT_LEASE": "5", "QT_NOTIFY": notify}
    kills = redis_restarts = 0
    with Processes(env, log_dir) as procs:
        if notify.startswith("redis"):
            procs.env["QT_REDIS_URL"] = procs.start_redis()
            procs.env["QT_REDIS_PREFIX"] = services.unique_prefix()
        for _ in range(3):
            procs.start_worker(1, QT_CONCURRENCY="8")
        deadline = time.monotonic() + 120 + total / 5
        next_kill = time.monotonic() + random.uniform(2, 4)
        completed = 0
        # A tiny run may finish before its second restart is due: it still restarts
        # Redis twice (under idle workers) before stopping them.
        restarts_due = 2 if procs.redis is not None else 0
        while (completed < total or redis_restarts < restarts_due) and (
            time.monotonic() < deadline
        ):
            completed = (await db.counts()).get("completed", 0)
            if time.monotonic() >= next_kill:
                procs.kill_worker(random.choice(procs.live_workers()))
                procs.start_worker(1, QT_CONCURRENCY="8")
                kills += 1
                next_kill = time.monotonic() + random.uniform(2, 4)
            due = completed >= total * (redis_restarts + 1) / 3
            if redis_restarts < restarts_due and due:
                procs.kill_redis()
                await asyncio.sleep(1.0)
                procs.start_redis()
                redis_restarts += 1
            await asyncio.sleep(0.25)
        procs.stop_workers()
    rows = await db.rows()
    doubled, reruns = doubled_and_reruns(rows, procs.killed, atomic=False)
    return {
        "jobs started": total,
        "completed": completed,
        "lost": total - completed,
        "completed twice": doubled,
        "re-run after a kill": reruns,
        "effects missing": completed - len({row.job_id for row in rows}),
        "completed on a later attempt": _later_attempts(rows),
        "workers killed": kills,
        "Redis restarts": redis_restarts,
    }


async def schedules(db: Database, seconds: float, log_dir: Path) -> dict[str, object]:
    env = {**db.env(), "QT_MODE": "atomic", "QT_SCHEDULE_EVERY": "1", "QT_POLL": "0.5"}
    with Processes(env, log_dir) as procs:
        workers = [procs.start_worker(1, QT_CONCURRENCY="4") for _ in range(3)]
        # The run's time counts from the first tick: starting processes on a loaded
        # machine takes seconds of its own.
        await _until_started(db, time.monotonic() + 60)
        await asyncio.sleep(seconds / 2)
        procs.kill_worker(workers[0])
        procs.start_worker(1, QT_CONCURRENCY="4")
        await asyncio.sleep(seconds / 2)
        procs.stop_workers()
        # The chains of the last ticks may still wait: a worker without the schedule
        # finishes them.
        del procs.env["QT_SCHEDULE_EVERY"]
        procs.start_worker(1, QT_CONCURRENCY="4")
        async with db.engine.connect() as conn:
            inputs = (await conn.execute(select(db.jobs.c.input))).scalars().all()
        await _until_done(db, len(inputs), time.monotonic() + 60)
        procs.stop_workers()
    counts = Counter(dt.datetime.fromisoformat(value["tick"]) for value in inputs)
    ticks = sorted(counts)
    span = (ticks[-1] - ticks[0]).total_seconds() + 1 if ticks else 0
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(ticks)]
    rows = await db.rows()
    doubled, _ = doubled_and_reruns(rows, procs.killed, atomic=True)
    completed = (await db.counts()).get("completed", 0)
    return {
        "ticks started": len(ticks),
        "ticks started twice": sum(1 for n in counts.values() if n > 1),
        "ticks missing": int(span) - len(ticks),
        "longest gap (s)": max(gaps, default=0),
        "completed": completed,
        "lost": len(inputs) - completed,
        "completed twice": doubled,
        "workers killed": len(procs.killed),
    }


async def retention(db: Database, rounds: int, log_dir: Path) -> dict[str, object]:
    env = {**db.env(), "QT_MODE": "atomic", "QT_RETENTION": "0.2", "QT_POLL": "0.2"}
    blockers: list[str] = []
    dependents: dict[str, str] = {}  # dependent chain -> its blocker
    refused = 0
    with Processes(env, log_dir) as procs:
        for _ in range(3):
            procs.start_worker(1, QT_CONCURRENCY="8")
        for _ in range(rounds):
            started = await db.client.start_chains(
                [ChainSpec(TYPE_NAME, {"steps": 3, "sleep": 0.05}) for _ in range(5)]
            )
            for chain in started:
                blockers.append(chain.id)
                dependent = await db.client.start_chain(
                    TYPE_NAME, {"steps": 2}, blockers=[chain.id]
                )
                dependents[dependent.id] = chain.id
            # The blockers' last steps end about now: race the pruner for them.
            await asyncio.sleep(random.uniform(0.1, 0.5))
            for chain in started:
                try:
                    late = await db.client.start_chain(TYPE_NAME, {"steps": 2}, blockers=[chain.id])
                except ChainNotFoundError:
                    refused += 1
                else:
                    dependents[late.id] = chain.id
        chains = set(blockers) | set(dependents)
        deadline = time.monotonic() + 60 + rounds
        while time.monotonic() < deadline:
            finished = await _finished_chains(db)
            if chains <= finished:
                break
            await asyncio.sleep(0.5)
        procs.stop_workers()
    rows = await db.rows()
    finished = {row.chain_id for row in rows if row.steps == 1}
    first_start = {row.chain_id: row.started for row in rows if row.steps == 2}
    last_end = {row.chain_id: row.ended for row in rows if row.steps == 1}
    early = sum(
        1
        for dependent, blocker in dependents.items()
        if dependent in first_start and first_start[dependent] < last_end.get(blocker, 0)
    )
    doubled, _ = doubled_and_reruns(rows, procs.killed, atomic=True)
    unfinished = {status: n for status, n in (await db.counts()).items() if status != "completed"}
    return {
        "chains started": len(chains),
        "completed": len(chains & finished),
        "lost": len(chains - finished),
        "completed twice": doubled,
        "ran before its blocker": early,
        "dependents refused (blocker pruned)": refused,
        "unfinished jobs left": sum(unfinished.values()),
    }


async def _until_started(db: Database, deadline: float) -> None:
    """Wait (bounded) until the first job exists."""
    while True:
        if sum((await db.counts()).values()) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


def _later_attempts(rows: list[Any]) -> int:
    """Jobs whose recorded run was not their first attempt: an earlier one was killed."""
    return len({row.job_id for row in rows if row.attempt > 1})


async def _finished_chains(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        query = select(db.effects.c.chain_id).where(db.effects.c.steps == 1)
        return set((await conn.execute(query)).scalars().all())


async def run(args: argparse.Namespace) -> str:
    if args.seed is not None:
        random.seed(args.seed)
    scenarios = runner.choices(args.scenarios, SCENARIOS, "--scenarios")
    states = [kind.strip() for kind in args.state.split(",") if kind.strip()]
    scale = args.scale
    sections: list[str] = []
    log_root = Path(tempfile.mkdtemp(prefix="queuert-churn-logs-"))
    if "supervised" in scenarios:
        rows: dict[str, dict[str, object]] = {}
        for kind in states:
            total = max(20, round((1500 if kind == "postgres" else 1000) * scale))
            async with database(kind, args) as db:
                rows[_label(kind)] = await supervised(db, total, _logs(log_root, "sup", kind))
        sections += [
            "Supervised (`--processes 3`, 8 slots, a child SIGKILLed every 3-5 s, "
            "limits changed three times; atomic handlers):",
            table(rows, "state"),
        ]
    if "churn" in scenarios:
        rows = {}
        combos = [("postgres", "redis"), ("postgres", "redis-lists"), ("sqlite", "in-process")]
        for kind, notify in combos:
            if kind not in states:
                continue
            async with database(kind, args) as db:
                total = max(30, round(3000 * scale))
                label = f"{_label(kind)} + {notify}"
                rows[label] = await churn(db, notify, total, _logs(log_root, notify, kind))
        sections += [
            "Churn (3 worker processes, one SIGKILLed and replaced every 2-4 s, the "
            "private Redis killed and restarted twice; staged handlers):",
            table(rows, "state + notify"),
        ]
    if "schedules" in scenarios:
        rows = {}
        for kind in states:
            async with database(kind, args) as db:
                seconds = max(4.0, 30 * scale)
                rows[_label(kind)] = await schedules(db, seconds, _logs(log_root, "sched", kind))
        sections += [
            "Schedules (3 worker processes, every 1 s, one SIGKILLed and restarted half-way):",
            table(rows, "state"),
        ]
    if "retention" in scenarios:
        rows = {}
        for kind in states:
            async with database(kind, args) as db:
                rounds = max(3, round(40 * scale))
                rows[_label(kind)] = await retention(db, rounds, _logs(log_root, "ret", kind))
        sections += [
            "Retention (0.2 s, 3 worker processes; 3-step chains with dependents, "
            "some started as their blocker finishes):",
            table(rows, "state"),
        ]
    shutil.rmtree(log_root, ignore_errors=True)
    return runner.report(
        "Chaos runs",
        sections,
        notes=[await stacks.server_notes(_notes_args(args, states)), runner.machine_notes()],
    )


def _logs(root: Path, scenario: str, kind: str) -> Path:
    path = root / f"{scenario}-{kind}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _notes_args(args: argparse.Namespace, states: list[str]) -> argparse.Namespace:
    return argparse.Namespace(state=",".join(states), notify="noop", postgres_url=args.postgres_url)
