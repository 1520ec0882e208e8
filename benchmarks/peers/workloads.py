"""The workloads of ``python -m benchmarks peers``, run the same way for every queue.

Each driver script (``pgqueuer_side.py``, ``ours_side.py`` ...) implements
:class:`Side` for one queue and calls :func:`main`; this module times the
workloads, so every queue is measured by the same code. It imports only the
standard library: the peers' drivers run in a virtualenv of their own that does
not have queuert-notify installed.

Protocol: ``python <driver> <workload> --dsn ... [options]`` prints one JSON
object of figures (name with its unit -> value) on its last stdout line.
Timings are taken inside the driver, so interpreter start, imports and schema
installation are never counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

Arrival = Callable[[], None]
"""What a wake handler calls on its first line."""


class Side(Protocol):
    """One queue under test, its storage already created and empty."""

    async def setup(self) -> None:
        """Install the queue's schema and open its connections."""

    async def close(self) -> None:
        """Close everything :meth:`setup` and the workloads opened."""

    async def enqueue(self) -> None:
        """Enqueue one no-op job in a transaction of its own (committed on return)."""

    async def enqueue_batch(self, jobs: int) -> None:
        """Enqueue ``jobs`` no-op jobs in one transaction, with the queue's batch call."""

    async def fill(self, jobs: int) -> None:
        """Enqueue ``jobs`` no-op jobs in batches (untimed), then refresh the planner
        statistics (``ANALYZE``), as autovacuum would on a table that lives longer than
        a benchmark."""

    async def drain(self, jobs: int, concurrency: int) -> float:
        """Start one worker at ``concurrency``; return the seconds from its start until
        the ``jobs`` filled jobs are recorded as done in the database."""

    async def start_idle_worker(self, arrival: Arrival) -> Callable[[], Awaitable[None]]:
        """Start a worker (concurrency 1) whose no-op handler calls ``arrival()`` on its
        first line; return the coroutine function that stops it."""


def percentiles(samples: list[float], prefix: str = "") -> dict[str, float]:
    """p50, p90, p99 (nearest rank) of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)

    def rank(fraction: float) -> float:
        return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] * 1000

    return {
        f"{prefix}p50 ms": rank(0.5),
        f"{prefix}p90 ms": rank(0.9),
        f"{prefix}p99 ms": rank(0.99),
    }


async def enqueue_workload(side: Side, calls: int) -> dict[str, float]:
    """``calls`` enqueues one after another, each in its own transaction, after 50
    untimed ones (connections warm, statements prepared)."""
    for _ in range(min(50, calls)):
        await side.enqueue()
    durations = []
    began = time.perf_counter()
    for _ in range(calls):
        started = time.perf_counter()
        await side.enqueue()
        durations.append(time.perf_counter() - started)
    total = time.perf_counter() - began
    return {**percentiles(durations), "calls/s": calls / total}


async def batch_workload(side: Side, batches: int, size: int) -> dict[str, float]:
    """``batches`` transactions of ``size`` jobs each, after 2 untimed ones."""
    for _ in range(2):
        await side.enqueue_batch(size)
    began = time.perf_counter()
    for _ in range(batches):
        await side.enqueue_batch(size)
    return {f"{size}/tx jobs/s": batches * size / (time.perf_counter() - began)}


async def wake_workload(
    side: Side, samples: int, min_gap: float, max_gap: float
) -> dict[str, float]:
    """An idle worker; a job enqueued after a random gap; latency from the start of the
    enqueue call to the handler's first line. The next gap starts once the handler
    ran, so every job finds the worker idle. The latency splits in two: the enqueue
    call's own p50 (its commit, in the same idle conditions: the part no wakeup can
    save) and the p50 from the call's return (the commit) to the handler: the wakeup,
    the claim and the dispatch."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[float]] = []

    def arrival() -> None:
        now = time.perf_counter()
        # Handlers may run on another thread (sync executors): hand over through the loop.
        loop.call_soon_threadsafe(_settle, waiting, now)

    stop = await side.start_idle_worker(arrival)
    latencies = []
    enqueues = []
    wakeups = []
    try:
        await asyncio.sleep(0.5)  # past the worker's start-up and first poll: it is idle
        for _ in range(samples):
            await asyncio.sleep(random.uniform(min_gap, max_gap))
            future: asyncio.Future[float] = loop.create_future()
            waiting.append(future)
            started = time.perf_counter()
            await side.enqueue()
            committed = time.perf_counter()
            enqueues.append(committed - started)
            async with asyncio.timeout(30):
                arrived = await future
            latencies.append(arrived - started)
            wakeups.append(arrived - committed)
    finally:
        await stop()
    return {
        **percentiles(latencies),
        "enqueue call p50 ms": percentiles(enqueues)["p50 ms"],
        "commit → handler p50 ms": percentiles(wakeups)["p50 ms"],
    }


def _settle(waiting: list[asyncio.Future[float]], now: float) -> None:
    while waiting:
        future = waiting.pop(0)
        if not future.done():
            future.set_result(now)


async def drain_workload(
    side: Side, jobs: int, concurrency: int, database: str
) -> dict[str, float]:
    """Fill ``jobs`` no-op jobs, then time one worker draining them. Also the CPU over
    the whole drain call (start-up and shut-down included): what this process and its
    children used (the queue's side), in % of one core and in µs per job; what the
    Postgres backends serving ``database`` used, in µs per job (the database's side of
    a job, whatever the queue's statements are; absent when the server is not on this
    host); and what the whole machine used (the database, the queue and anything else
    running), in % of one core."""
    await side.fill(jobs)
    backends_before = _backend_cpu(database)
    queue_before, machine_before = _queue_cpu(), _machine_cpu()
    began = time.perf_counter()
    seconds = await side.drain(jobs, concurrency)
    wall = time.perf_counter() - began
    queue = _queue_cpu() - queue_before
    backends = _backend_cpu(database)
    busy, total = (
        after - before for after, before in zip(_machine_cpu(), machine_before, strict=True)
    )
    figures = {
        "jobs/s": jobs / seconds,
        "queue CPU %": 100 * queue / wall,
        "queue CPU µs/job": 1e6 * queue / jobs,
    }
    if backends:
        # A backend that connected during the drain counts from its start; one that
        # already ended is lost (pools keep theirs until the side closes).
        used = sum(cpu - backends_before.get(pid, 0.0) for pid, cpu in backends.items())
        figures["Postgres CPU µs/job"] = 1e6 * used / jobs
    figures["machine CPU %"] = 100 * (os.cpu_count() or 1) * busy / total if total else math.nan
    return figures


def _queue_cpu() -> float:
    """CPU seconds of this process and of its waited-for children (worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _backend_cpu(database: str) -> dict[int, float]:
    """CPU seconds of each Postgres backend on this host connected to ``database``, by
    process id, from /proc (a backend's title is ``postgres: ... user database host``);
    empty when there is none (a remote server, SQLite)."""
    if not database:
        return {}
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not title.startswith("postgres: ") or f" {database} " not in title:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        # utime and stime: fields 14 and 15 of stat, 12 and 13 after the command name.
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def database_name(dsn: str) -> str:
    """The database a libpq URL names (empty for a SQLite path)."""
    if "://" not in dsn:
        return ""
    return urllib.parse.unquote(urllib.parse.urlsplit(dsn).path.lstrip("/"))


def _machine_cpu() -> tuple[float, float]:
    """(busy, busy + idle) ticks of every core since boot, from /proc/stat; time stolen
    by the hypervisor counts as neither."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except OSError:
        return (0.0, 0.0)
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    busy = user + nice + system + irq + softirq
    return (float(busy), float(busy + idle + iowait))


def parser(description: str) -> argparse.ArgumentParser:
    """The options every driver accepts."""
    top = argparse.ArgumentParser(description=description)
    top.add_argument("workload", choices=("enqueue", "batch", "wake", "drain"))
    top.add_argument("--dsn", required=True, help="a libpq URL, or a SQLite file path")
    top.add_argument("--calls", type=int, default=1000)
    top.add_argument("--batches", type=int, default=50)
    top.add_argument("--batch-size", type=int, default=100)
    top.add_argument("--samples", type=int, default=200)
    top.add_argument("--min-gap", type=float, default=0.010)
    top.add_argument("--max-gap", type=float, default=0.050)
    top.add_argument("--jobs", type=int, default=10_000)
    top.add_argument("--concurrency", type=int, default=10)
    top.add_argument(
        "--config",
        choices=("defaults", "matched"),
        default="matched",
        help="a peer's configuration: its documented defaults, or matched to ours at "
        "--concurrency (each driver's docstring says what each means for it)",
    )
    return top


async def run(side: Side, args: argparse.Namespace) -> dict[str, float]:
    """Set ``side`` up, run the workload ``args`` names on it, close it."""
    await side.setup()
    try:
        if args.workload == "enqueue":
            return await enqueue_workload(side, args.calls)
        if args.workload == "batch":
            return await batch_workload(side, args.batches, args.batch_size)
        if args.workload == "wake":
            return await wake_workload(side, args.samples, args.min_gap, args.max_gap)
        return await drain_workload(side, args.jobs, args.concurrency, database_name(args.dsn))
    finally:
        await side.close()


def main(
    make_side: Callable[[argparse.Namespace], Side],
    description: str,
    more_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Parse the command line (the common options and ``more_arguments``), run the
    workload, print its figures as JSON."""
    top = parser(description)
    if more_arguments is not None:
        more_arguments(top)
    args = top.parse_args()
    figures = asyncio.run(run(make_side(args), args))
    sys.stdout.write(json.dumps(figures) + "\n")
    sys.stdout.flush()
