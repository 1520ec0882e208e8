"""Issue #6: Redis round trips per committed transaction, whatever the number of job types.

Runs on a redis-server of its own (a free port, no persistence), so nothing
else's traffic is counted, and counts every transaction twice:

- round trips: the commands clients send, seen with MONITOR (commands run
  inside a Lua script are marked ``lua`` and are not round trips; the adapter
  does not pipeline, so one command is one round trip);
- commands executed: the ``INFO commandstats`` delta, which also counts what
  the Lua scripts run (INCRBY, EXPIRE, PUBLISH): the work one round trip does.

After each measured transaction the benchmark waits for the after-commit
publish (``wait_for_notifications``), then sends a marker through its own
connection: what MONITOR shows before the marker belongs to that transaction,
and the marker connection's own ECHO and INFO are left out of both counts.

Also counted: the Redis commands a worker sends per job it drains.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.ext.asyncio import AsyncSession

from benchmarks import runner, services, stacks
from benchmarks.drain import fill
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from state_adapters.notifications import wait_for_notifications

NAME = "redis-cost"
HELP = "Redis round trips per committed transaction (1 and 3 job types) and per drained job"

_OWN_COMMANDS = frozenset({"echo", "info", "monitor"})
"""What the counting itself sends: left out of every count."""
_LIFETIME = frozenset({"subscribe", "unsubscribe"})
"""What a worker sends once in its life, not per job."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="transactions per case")
    parser.add_argument("--drain-jobs", type=int, default=200, help="jobs the worker drains")
    stacks.add_stack_arguments(parser)
    parser.set_defaults(notify="redis")


@asynccontextmanager
async def _private_redis() -> AsyncIterator[str]:
    """A redis-server on a free port, seen by nobody else; stopped on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-cost needs redis-server on PATH (it starts a private one)")
    port = services.free_port()
    workdir = tempfile.mkdtemp(prefix="queuert-bench-redis-")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        probe = Redis.from_url(url)
        try:
            async with asyncio.timeout(10):
                while True:
                    with suppress(OSError, RedisConnectionError):
                        if await probe.ping():
                            break
                    await asyncio.sleep(0.05)
        finally:
            await probe.aclose()
        yield url
    finally:
        process.terminate()
        async with asyncio.timeout(10):
            await process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class _Commands:
    """What clients sent between two marks, and what the server ran for it."""

    sent: list[str]
    """Command names clients sent (MONITOR, Lua-internal calls left out): round trips."""
    executed: dict[str, int]
    """Calls per command name from the ``INFO commandstats`` delta, Lua-internal included."""


class _CommandLog:
    """The commands clients send to a server, between markers."""

    def __init__(self, url: str) -> None:
        self._monitor_client = Redis.from_url(url)
        self._marker_client = Redis.from_url(url, single_connection_client=True)
        self._lines: list[dict[str, Any]] = []
        self._seen = asyncio.Event()
        self._marker = ""
        self._calls: dict[str, int] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read(ready))
        async with asyncio.timeout(5):
            await ready.wait()
        await self.mark()

    async def _read(self, ready: asyncio.Event) -> None:
        async with self._monitor_client.monitor() as monitor:
            ready.set()
            async for line in monitor.listen():
                if line["command"] == f"ECHO {self._marker}":
                    self._seen.set()
                elif line["client_type"] != "lua":
                    self._lines.append(line)

    async def mark(self) -> _Commands:
        """What clients sent since the previous mark. Call it once the commands to
        count have been answered: Redis runs commands in order, so MONITOR shows
        them before the marker."""
        self._marker = f"queuert-bench-{uuid.uuid4().hex}"
        self._seen = asyncio.Event()
        await self._marker_client.echo(self._marker)
        async with asyncio.timeout(5):
            await self._seen.wait()
        lines, self._lines = self._lines, []
        sent = [line["command"].split(" ", 1)[0].lower() for line in lines]
        calls = await self._command_calls()
        executed = {
            name: count - self._calls.get(name, 0)
            for name, count in calls.items()
            if count > self._calls.get(name, 0) and name not in _OWN_COMMANDS
        }
        self._calls = calls
        return _Commands([name for name in sent if name not in _OWN_COMMANDS], executed)

    async def _command_calls(self) -> dict[str, int]:
        stats = await self._marker_client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): int(fields["calls"]) for name, fields in stats.items()
        }

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with suppress(asyncio.CancelledError):
                await self._reader
        await self._marker_client.aclose()
        await self._monitor_client.aclose()


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


def _transactions(stack: stacks.Stack) -> dict[str, Callable[[], Awaitable[object]]]:
    client = stack.client
    three = [ChainSpec("bench-a"), ChainSpec("bench-b"), ChainSpec("bench-c")]

    async def caller_tx(type_names: list[str]) -> None:
        async with AsyncSession(stack.engine) as session, session.begin():
            for type_name in type_names:
                await client.start_chain(type_name, session=session)

    return {
        "own tx, 1 chain, 1 type": lambda: client.start_chain("bench-a"),
        "own tx, 3 chains of 3 types": lambda: client.start_chains(three),
        "own tx, 100 chains of 1 type": lambda: client.start_chains([ChainSpec("bench-a")] * 100),
        "caller tx, 1 chain, 1 type": lambda: caller_tx(["bench-a"]),
        "caller tx, 3 start_chain calls of 3 types": lambda: caller_tx(
            ["bench-a", "bench-b", "bench-c"]
        ),
    }


async def _per_job(stack: stacks.Stack, log: _CommandLog, jobs: int) -> tuple[runner.Figures, str]:
    """Redis round trips and commands executed per job while one worker (concurrency
    10) drains ``jobs`` jobs."""
    await fill(stack, jobs, "bench-drain")
    client = await stack.new_client()  # connected (scripts loaded) before counting starts
    await wait_for_notifications()
    await log.mark()
    completions = stacks.Completions(jobs)

    async with Worker(client, {"bench-drain": _noop}, on_event=completions):
        async with asyncio.timeout(120):
            await completions.done.wait()
    # Stopped: every completion's notification has gone out.
    await wait_for_notifications()
    commands = await log.mark()
    # The worker's lifetime subscriptions are not a cost per job.
    sent = sum(1 for command in commands.sent if command not in _LIFETIME)
    executed = sum(count for name, count in commands.executed.items() if name not in _LIFETIME)
    figures = {"Redis round trips": sent / jobs, "commands executed": executed / jobs}
    return figures, _summary(commands)


def _summary(commands: _Commands) -> str:
    """``sent: evalsha x1; executed: evalsha x1, expire x3, ...``"""
    sent: dict[str, int] = {}
    for command in commands.sent:
        sent[command] = sent.get(command, 0) + 1
    return f"sent {_listing(sent)}; executed {_listing(commands.executed)}"


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(f"{name.upper()} x{count}" for name, count in sorted(counts.items())) or "none"


async def run(args: argparse.Namespace) -> str:
    sections = []
    async with _private_redis() as url:
        args.redis_url = url
        version = await services.redis_server_version(url)
        log = _CommandLog(url)
        await log.start()
        try:
            for state_kind, notify_kind in stacks.combinations(args):
                rows: dict[str, runner.Figures] = {}
                seen: dict[str, str] = {}
                async with stacks.open_stack(state_kind, notify_kind, args) as stack:
                    for case, transaction in _transactions(stack).items():
                        trips, executed = [], []
                        for _ in range(args.rounds):
                            await wait_for_notifications()
                            await log.mark()
                            await transaction()
                            await wait_for_notifications()
                            commands = await log.mark()
                            trips.append(len(commands.sent))
                            executed.append(sum(commands.executed.values()))
                            seen[case] = _summary(commands)
                        rows[case] = {
                            "Redis round trips": statistics.median(trips),
                            "commands executed": statistics.median(executed),
                        }
                    case = f"worker, per job drained ({args.drain_jobs} jobs, concurrency 10)"
                    rows[case], seen[case] = await _per_job(stack, log, args.drain_jobs)
                table = runner.table(rows, first_column="per committed transaction (or per job)")
                listing = "\n".join(f"- {case}: {summary}" for case, summary in seen.items())
                title = stacks.label(state_kind, notify_kind)
                sections.append(f"{title}:\n\n{table}\n\nCommands seen (last round):\n\n{listing}")
        finally:
            await log.close()
    return runner.report(
        "Redis round trips per committed transaction",
        [
            f"Medians of {args.rounds} transactions per case; round trips counted with "
            "MONITOR (commands clients sent), commands executed with the INFO commandstats "
            "delta (including those run inside Lua):",
            *sections,
        ],
        notes=[f"private redis-server {version}; {runner.machine_notes()}"],
    )
