"""Issue #30: how long a ``queuert-notify`` command takes from exec to exit.

Runs the installed console script (a fresh interpreter each time, as a user's shell
does): ``--help``, and ``chains list`` on a migrated SQLite file and on Postgres tables
of its own (five chains each). With ``--baseline DIR`` (a checkout of an older commit,
e.g. ``git worktree add /tmp/before <commit>``) the same commands also run with that
checkout first on ``PYTHONPATH``, alternating round by round with this one, so both
sides see the same load. Figures are wall-clock and CPU (user + system) milliseconds of
the command's process, medians over rounds. The commands run with bytecode caches, as
an installed package's do (pip writes them): the warm-up round writes any that are
missing even where ``PYTHONDONTWRITEBYTECODE`` is set, which otherwise made every run
compile the project's modules from source (a fifth of ``chains list``'s instructions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from benchmarks import runner, services, stacks

NAME = "cli-start"
HELP = "wall time of `queuert-notify --help` and `chains list` (fresh process each)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=10, help="recorded rounds")
    parser.add_argument(
        "--baseline", default=None, help="a checkout of another commit to compare with"
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())


async def run(args: argparse.Namespace) -> str:
    from sqlalchemy.ext.asyncio import create_async_engine

    from queuert_notify import Client, NoopNotifyAdapter
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    script = str(Path(sys.executable).parent / "queuert-notify")
    workdir = tempfile.mkdtemp(prefix="queuert-bench-")
    sqlite_url = f"sqlite+aiosqlite:///{workdir}/jobs.db"
    table_prefix = f"{services.unique_prefix()}_"
    engines = [create_async_engine(sqlite_url), create_async_engine(args.postgres_url)]
    try:
        for engine in engines:
            state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
            await state.migrate()
            async with Client(state=state, notify=NoopNotifyAdapter()) as client:
                for n in range(5):
                    await client.start_chain("send-email", {"n": n})
        commands = {
            "--help": ["--help"],
            "chains list, SQLite": _chains_list(sqlite_url, table_prefix),
            "chains list, Postgres": _chains_list(args.postgres_url, table_prefix),
        }
        checkouts = {"this checkout": None}
        if args.baseline is not None:
            checkouts[f"baseline ({args.baseline})"] = args.baseline
        variants = [
            runner.Variant(name, _timer(script, commands, path)) for name, path in checkouts.items()
        ]
        results = await runner.alternate(variants, args.rounds)
    finally:
        async with engines[1].begin() as conn:
            await conn.run_sync(stacks.drop_prefixed, table_prefix)
        for engine in engines:
            await engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = results.all_medians()
    return runner.report(
        "CLI start-up",
        [runner.table(rows, first_column="checkout")],
        notes=[
            f"medians of {args.rounds} alternating rounds, one process per command per round",
            runner.machine_notes(),
        ],
    )


def _chains_list(database_url: str, table_prefix: str) -> list[str]:
    return ["chains", "list", "--database-url", database_url, "--table-prefix", table_prefix]


def _timer(
    script: str, commands: dict[str, list[str]], checkout: str | None
) -> Callable[[], Awaitable[runner.Figures]]:
    """One round: each command once, in a fresh process, with ``checkout`` (if any)
    first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, env.get("PYTHONPATH")]))

    async def one_round() -> runner.Figures:
        figures = {}
        for name, argv in commands.items():
            wall, cpu = await _time(script, argv, env)
            figures[f"{name}: wall ms"] = wall
            figures[f"{name}: CPU ms"] = cpu
        return figures

    return one_round


async def _time(script: str, argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU (user + system) milliseconds of one run of the command. CPU
    time counts the process's own work only, so it moves less with the machine's load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        script, *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await process.communicate()
    elapsed = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"queuert-notify {' '.join(argv)} failed: {stderr.decode()}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, cpu * 1000
