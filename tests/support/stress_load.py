"""The load behind ``./dev test --stress``: the project's own enqueue-and-drain loop
(``start_chains``, a real ``Worker`` through ``run_until_idle``, ``prune``) on a SQLite
file of its own, round after round, keeping one core busy. ``./dev`` starts two, so the
suite runs on a machine whose both cores are taken, as in a loaded CI run.

Bounded: it stops when its parent (``./dev``) is gone or after ``--limit`` seconds,
whichever comes first; ``./dev`` also kills it when the suite ends.

    python -m tests.support.stress_load --limit 2400
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import ChainSpec, Client, InProcessNotifyAdapter
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter

ROUND = 2000
"""Chains started and drained per round (well under a second of work on a quiet core)."""


async def _step(job: Any, ctx: Any) -> Any:
    if job.input["n"] % 2 == 0:
        return ctx.continue_with("stress-last", job.input)
    return job.input


async def _last(job: Any, ctx: Any) -> None:
    return None


async def load(database: Path, limit: float) -> int:
    """Run rounds until the parent is gone or ``limit`` seconds passed; returns the
    number of rounds."""
    parent, ends = os.getppid(), time.monotonic() + limit
    engine = create_async_engine(f"sqlite+aiosqlite:///{database}")
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    handlers = {"stress-step": _step, "stress-last": _last}
    rounds = 0
    try:
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            while os.getppid() == parent and time.monotonic() < ends:
                await client.start_chains(
                    [ChainSpec("stress-step", {"n": n}) for n in range(ROUND)]
                )
                await run_until_idle(client, handlers, timeout=600)
                await client.prune(older_than=timedelta(0))
                rounds += 1
    finally:
        await engine.dispose()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=2400.0, help="seconds at most")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="queuert-stress-") as directory:
        rounds = asyncio.run(load(Path(directory) / "stress.db", args.limit))
    print(f"stress load: {rounds} rounds of {ROUND} chains")


if __name__ == "__main__":
    main()
