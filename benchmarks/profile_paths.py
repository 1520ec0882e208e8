"""Where a start's and a claim's microseconds go, by layer (issue #17 item 4).

``python -m benchmarks.profile_paths [--state postgres] [--notify noop] [--starts 2000]
[--jobs 5000]`` runs, under cProfile, ``--starts`` calls of
``client.start_chain`` (each in its own transaction), then one worker
(concurrency 10) draining ``--jobs`` no-op jobs, and prints for each the
self time per call (per job for the drain) summed by the layer its code lives in:
the event loop waiting for sockets (the servers' round trips), the database driver
(psycopg or aiosqlite), SQLAlchemy, queuert-notify (client, worker, state
adapter), redis-py, asyncio's own bookkeeping, and the rest (stdlib).

cProfile slows Python code down (roughly 1.5-2x here), not the waits: read the
shares, and the absolute figures as upper bounds. ``--sampler`` profiles the drain
with a sampler on the process's CPU clock instead (see :class:`CpuSampler`) and
prints each layer's self time as CPU µs per job, the shares of ``time.process_time()``
over the drain: nothing is added per call, and time the process sat descheduled on
a busy machine is not counted. Not a registered benchmark: a tool for reading
profiles, no table of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import signal
import time
from collections import Counter, defaultdict
from types import FrameType, TracebackType

from benchmarks import services, stacks
from benchmarks.drain import fill
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

_LAYERS = (
    ("waiting on sockets (server round trips)", ("select.epoll", "selectors.py")),
    ("socket send/recv system calls", ("_socket.socket", "'send'", "'recv'")),
    ("psycopg", ("/psycopg/", "psycopg_binary", "psycopg_c")),
    ("aiosqlite + sqlite3", ("/aiosqlite/", "sqlite3", "_sqlite3")),
    ("SQLAlchemy", ("/sqlalchemy/", "greenlet")),
    ("queuert_notify", ("/queuert_notify/",)),
    ("state_adapters", ("/state_adapters/",)),
    ("redis-py", ("/redis/", "hiredis")),
    ("asyncio", ("/asyncio/", "_asyncio")),
    ("threads (aiosqlite's hand-over)", ("threading.py", "_thread", "queue.py")),
)


def _layer(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    for name, needles in _LAYERS:
        if any(needle in where for needle in needles):
            return name
    return "other (stdlib: json, uuid, datetime, logging ...)"


def by_layer(profile: cProfile.Profile, calls: int) -> dict[str, float]:
    """Self time per call (µs) summed by layer."""
    stats = pstats.Stats(profile)
    totals: dict[str, float] = defaultdict(float)
    others: dict[str, float] = defaultdict(float)
    for (filename, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        layer = _layer(filename, function)
        totals[layer] += row[2]  # tottime
        if layer.startswith("other"):
            others[f"{filename.rsplit('/', 1)[-1]}:{function}"] += row[2]
    top = sorted(others.items(), key=lambda item: -item[1])[:5]
    print("  largest in other:", ", ".join(f"{name} {t / calls * 1e6:.0f} µs" for name, t in top))
    return {name: seconds / calls * 1e6 for name, seconds in totals.items()}


class CpuSampler:
    """Counts, every ``interval`` seconds of this process's CPU time (``SIGPROF``), the
    function the main thread is running. The signal is handled between two bytecodes,
    so the time of a C call (a driver's, a system call's) lands on the Python function
    that called it, or on the next one that runs after it returns."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.leaves: Counter[tuple[str, str]] = Counter()

    def __enter__(self) -> CpuSampler:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        if frame is not None:
            self.leaves[(frame.f_code.co_filename, frame.f_code.co_qualname)] += 1

    def largest(self, cpu_per_job_us: float, count: int) -> list[str]:
        """The ``count`` functions with the most samples, as CPU µs per job."""
        total = sum(self.leaves.values()) or 1
        return [
            f"{filename.rsplit('/', 1)[-1]}:{function} {n / total * cpu_per_job_us:.1f} µs"
            for (filename, function), n in self.leaves.most_common(count)
        ]

    def by_layer(self, cpu_per_job_us: float) -> dict[str, float]:
        """Each layer's share of the samples, as CPU µs per job."""
        total = sum(self.leaves.values()) or 1
        layers: dict[str, float] = defaultdict(float)
        for (filename, function), count in self.leaves.items():
            layers[_layer(filename, function)] += count / total * cpu_per_job_us
        return layers


def _print(title: str, wall_us: float, layers: dict[str, float]) -> None:
    print(f"\n{title}: {wall_us:,.0f} µs wall per call under the profiler")
    print("| layer | µs per call | share |")
    print("|---|---|---|")
    total = sum(layers.values())
    for name, micros in sorted(layers.items(), key=lambda item: -item[1]):
        print(f"| {name} | {micros:,.1f} | {micros / total:.0%} |")


async def main(args: argparse.Namespace) -> None:
    async with stacks.open_stack(args.state, args.notify, args, pool_size=14) as stack:
        for _ in range(200):  # warm: connections, prepared statements, caches
            await stack.client.start_chain("bench-noop")
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        for _ in range(args.starts):
            await stack.client.start_chain("bench-noop")
        profile.disable()
        wall = (time.perf_counter() - began) / args.starts * 1e6
        _print(
            f"start_chain, own transaction ({stack.label})", wall, by_layer(profile, args.starts)
        )

    async with stacks.open_stack(args.state, args.notify, args, pool_size=14) as stack:
        await fill(stack, args.jobs)
        await stack.analyze()
        completions = stacks.Completions(args.jobs)

        async def noop(job: Job, ctx: JobContext) -> None:
            return None

        worker = Worker(
            await stack.new_client(), {"bench-noop": noop}, concurrency=10, on_event=completions
        )
        if args.sampler:
            sampler = CpuSampler()
            began, cpu_began = time.perf_counter(), time.process_time()
            with sampler:
                async with worker:
                    await completions.done.wait()
            cpu = (time.process_time() - cpu_began) / args.jobs * 1e6
            wall = (time.perf_counter() - began) / args.jobs * 1e6
            print(f"\n{sum(sampler.leaves.values()):,} samples; {cpu:,.0f} µs of CPU per job")
            print("  largest functions:", ", ".join(sampler.largest(cpu, 12)))
            _print(
                f"drain, per job: claim, run, complete ({stack.label}, concurrency 10), "
                "self CPU µs per job (sampled)",
                wall,
                sampler.by_layer(cpu),
            )
            return
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        async with worker:
            await completions.done.wait()
        profile.disable()
        wall = (time.perf_counter() - began) / args.jobs * 1e6
        _print(
            f"drain, per job: claim, run, complete ({stack.label}, concurrency 10)",
            wall,
            by_layer(profile, args.jobs),
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", choices=stacks.STATE_KINDS, default="postgres")
    parser.add_argument("--notify", choices=stacks.NOTIFY_KINDS, default="noop")
    parser.add_argument("--starts", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--sampler",
        action="store_true",
        help="profile the drain with a sampler on the CPU clock instead of cProfile",
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--nats-url", default=services.nats_url())
    asyncio.run(main(parser.parse_args()))
