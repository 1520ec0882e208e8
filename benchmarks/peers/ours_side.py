"""queuert-notify's side of ``python -m benchmarks peers`` (runs in the product's
virtualenv, as ``python -m benchmarks.peers.ours_side``).

The state backend and notify adapter are chosen with ``--state`` and
``--notify``; the stack is :func:`benchmarks.stacks.open_stack`'s (fresh tables
under a prefix of their own, dropped afterwards; the worker gets a client and
notify adapter of its own, as another machine would). Enqueue is
``client.start_chain(type)`` without a session (the client's own transaction,
the wakeup published after its commit); a batch is ``client.start_chains``.
``--processes N`` > 1 drains with ``queuert-notify worker --processes N`` (the
supervisor and N worker processes) instead of a worker in this process;
``--claim-ahead`` drains with ``Worker(claim_ahead=True)``, the documented
setting for many short jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from sqlalchemy import text
from sqlalchemy.engine import make_url

from benchmarks import stacks
from benchmarks.peers import workloads
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker

_TYPE = "bench-noop"
_FILL_BATCH = 1000


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


class OursSide:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.exits = AsyncExitStack()
        self.stack: stacks.Stack

    async def setup(self) -> None:
        dsn = self.args.dsn
        if self.args.state == "postgres":
            url = make_url(dsn).set(drivername=f"postgresql+{self.args.driver}")
            dsn = url.render_as_string(hide_password=False)
        stack_args = argparse.Namespace(
            postgres_url=dsn,
            redis_url=self.args.redis_url,
            nats_url=self.args.nats_url,
        )
        if self.args.state == "sqlite":
            stack_args.postgres_url = None
        self.stack = await self.exits.enter_async_context(
            stacks.open_stack(
                self.args.state,
                self.args.notify,
                stack_args,
                pool_size=self.args.concurrency + 4,
            )
        )

    async def close(self) -> None:
        await self.exits.aclose()

    async def enqueue(self) -> None:
        await self.stack.client.start_chain(_TYPE)

    async def enqueue_batch(self, jobs: int) -> None:
        await self.stack.client.start_chains([ChainSpec(_TYPE) for _ in range(jobs)])

    async def fill(self, jobs: int) -> None:
        for offset in range(0, jobs, _FILL_BATCH):
            await self.enqueue_batch(min(_FILL_BATCH, jobs - offset))
        await self.stack.analyze()

    async def drain(self, jobs: int, concurrency: int) -> float:
        if self.args.processes > 1:
            return await self._drain_in_processes(jobs, concurrency)
        return await self._drain_here(jobs, concurrency)

    async def _drain_here(self, jobs: int, concurrency: int) -> float:
        completions = stacks.Completions(jobs)

        worker = Worker(
            await self.stack.new_client(),
            {_TYPE: _noop},
            concurrency=concurrency,
            claim_ahead=self.args.claim_ahead,
            on_event=completions,
        )
        started = time.perf_counter()
        async with worker, asyncio.timeout(max(120.0, jobs / 20)):
            await completions.done.wait()
        return completions.last - started

    async def _drain_in_processes(self, jobs: int, concurrency: int) -> float:
        """``queuert-notify worker --processes N`` on this stack's tables, timed from the
        first claim (the children's interpreter start and imports are not counted, as
        they are not for a worker in this process) until the database shows no
        unfinished job; both read from the database every 10 ms."""
        env = {
            **os.environ,
            "QUEUERT_BENCH_DATABASE_URL": str(self.stack.engine.url.render_as_string(False)),
            "QUEUERT_BENCH_TABLE_PREFIX": f"{self.stack.prefix}_",
            "QUEUERT_BENCH_CONCURRENCY": str(concurrency),
            "QUEUERT_BENCH_PREFIX": self.stack.prefix,
        }
        if self.args.notify == "redis":
            env["QUEUERT_BENCH_REDIS_URL"] = self.args.redis_url
        command = [
            sys.executable,
            "-m",
            "queuert_notify.cli",
            "worker",
            "benchmarks.peers.ours_worker:build_worker",
            f"--processes={self.args.processes}",
        ]
        supervisor = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=asyncio.subprocess.DEVNULL
        )
        try:
            async with asyncio.timeout(max(120.0, jobs / 20)):
                # Other processes do the work: the database is the only witness.
                while await self._count("status = 'pending'") == jobs:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                started = time.perf_counter()
                while await self._count("status <> 'completed'") > 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            return time.perf_counter() - started
        finally:
            supervisor.terminate()
            await supervisor.wait()

    async def _count(self, where: str) -> int:
        table = f"{self.stack.prefix}_jobs"
        async with self.stack.engine.connect() as conn:
            count = await conn.scalar(text(f"SELECT count(*) FROM {table} WHERE {where}"))
        return int(count or 0)

    async def start_idle_worker(self, arrival: workloads.Arrival) -> Callable[[], Awaitable[None]]:
        async def handler(job: Job, ctx: JobContext) -> None:
            arrival()

        worker = Worker(
            await self.stack.new_client(), {_TYPE: handler}, concurrency=1, poll_interval=60.0
        )
        await worker.__aenter__()

        async def stop() -> None:
            await worker.__aexit__(None, None, None)

        return stop


def _side(args: argparse.Namespace) -> OursSide:
    return OursSide(args)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=stacks.STATE_KINDS, default="postgres")
    parser.add_argument("--driver", choices=("psycopg", "asyncpg"), default="psycopg")
    parser.add_argument("--notify", choices=stacks.NOTIFY_KINDS, default="redis")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--nats-url", default=None)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument(
        "--claim-ahead", action="store_true", help="drain with Worker(claim_ahead=True)"
    )


if __name__ == "__main__":
    workloads.main(_side, __doc__ or "", _arguments)
