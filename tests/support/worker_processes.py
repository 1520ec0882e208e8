"""Worker processes started through the CLI (``queuert-notify worker module:attr``),
for tests that kill, restart or outlive them (fixtures:
``tests.support.worker_process_fixtures``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_APP = "tests.support.e2e_app:build_worker"


class WorkerProcesses:
    """Worker processes this test started; every one is killed at teardown."""

    def __init__(self, env: dict[str, str], log_dir: Path, app: str = DEFAULT_APP) -> None:
        self.env = env
        self.log_dir = log_dir
        self.app = app
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, worker_id: str, **settings: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, "QT_WORKER_ID": worker_id, **settings}
        log = (self.log_dir / f"{worker_id}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "queuert_notify.cli", "worker", self.app, "--processes=1"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def start_supervisor(
        self, name: str, processes: int, *, verbose: bool = False, **settings: str
    ) -> subprocess.Popen[bytes]:
        """``queuert-notify worker --processes N``: its children get ids of their own
        (``proc-<pid>``), its log is ``log(name)`` (INFO records too with ``verbose``)."""
        env = {**os.environ, **self.env, **settings}
        env.pop("QT_WORKER_ID", None)
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "queuert_notify.cli",
                *(["-v"] if verbose else []),
                "worker",
                self.app,
                f"--processes={processes}",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def log(self, worker_id: str) -> str:
        return (self.log_dir / f"{worker_id}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


async def effect_counts(engine: AsyncEngine, effects: Any) -> tuple[int, int]:
    """(rows, distinct job ids) in the effects table: equal when no job ran twice."""
    async with engine.connect() as conn:
        rows, distinct = (
            await conn.execute(select(func.count(), func.count(func.distinct(effects.c.job_id))))
        ).one()
    return int(rows), int(distinct)
