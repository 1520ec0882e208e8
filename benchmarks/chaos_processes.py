"""The processes ``python -m benchmarks churn`` starts and kills: worker processes (each in a
process group of its own, so a kill reaches a supervisor's children too) and a private
redis-server on a free loopback port. :class:`Processes` is a context manager that kills
every process it started on exit, whatever happened."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from types import TracebackType

from benchmarks.services import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent
APP = "benchmarks.chaos_app:build_worker"


class Processes:
    """Worker processes and a redis-server of one scenario; all killed on exit.

    ``killed`` holds the worker ids (``proc-<pid>``) of every worker process SIGKILLed,
    so a re-run can be told apart from a job completed twice by a live worker."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.workers: list[subprocess.Popen[bytes]] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port = 0
        self.killed: set[str] = set()

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for proc in self.workers:
            _kill_group(proc)
        self.kill_redis()

    def start_worker(self, processes: int = 1, **settings: str) -> subprocess.Popen[bytes]:
        """``queuert-notify worker benchmarks.chaos_app:build_worker --processes N``; with
        one process, the worker runs in the started process itself."""
        env = {**os.environ, **self.env, **settings}
        env.pop("QT_WORKER_ID", None)
        log = (self.log_dir / f"worker-{len(self.workers)}.log").open("wb")
        argv = [sys.executable, "-m", "queuert_notify.cli", "worker", APP]
        proc = subprocess.Popen(
            [*argv, f"--processes={processes}"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def live_workers(self) -> list[subprocess.Popen[bytes]]:
        return [proc for proc in self.workers if proc.poll() is None]

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a worker process started with ``processes=1``."""
        self.killed.add(f"proc-{proc.pid}")
        proc.kill()
        proc.wait(30)

    def kill_child(self, supervisor: subprocess.Popen[bytes], index: int) -> bool:
        """SIGKILL one child of ``supervisor`` (the ``index``-th, modulo their number);
        False when it has none right now (it is restarting one)."""
        children = _children(supervisor.pid)
        if not children:
            return False
        pid = children[index % len(children)]
        self.killed.add(f"proc-{pid}")
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return True

    def stop_workers(self, timeout: float = 60.0) -> list[int | None]:
        """SIGTERM every live worker (a supervisor passes it on), wait for their drain;
        the exit codes (None: killed after ``timeout``)."""
        for proc in self.live_workers():
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.workers:
            try:
                codes.append(proc.wait(timeout))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                codes.append(None)
        return codes

    def start_redis(self) -> str:
        """A private redis-server on a free loopback port (never the shared one)."""
        if shutil.which("redis-server") is None:
            raise SystemExit("churn needs redis-server on PATH: it kills and restarts its own")
        if not self.redis_port:
            self.redis_port = free_port()
        log = (self.log_dir / "redis.log").open("ab")
        argv = ["--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        self.redis = subprocess.Popen(
            ["redis-server", *argv, "--appendonly", "no"],
            cwd=self.log_dir,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_for_port(self.redis_port, self.redis)
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def kill_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait(10)
        self.redis = None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and its process group (a supervisor's children are in it)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(10)
