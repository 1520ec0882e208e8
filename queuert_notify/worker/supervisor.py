"""Several worker processes under one supervisor (``queuert-notify worker --processes N``).

One asyncio worker process uses one core; a machine with more cores runs more
processes. The supervisor starts N copies of the worker command, keeps N
running, and stops them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from state_adapters.backoff import Backoff

if TYPE_CHECKING:
    from queuert_notify.worker.worker import Worker

logger = logging.getLogger(__name__)

EXIT_DO_NOT_RESTART = 3
"""Exit code of a supervised worker that stopped on an error a restart cannot fix (a
bad setting, tables never migrated: the one-line errors of the CLI). The supervisor
then stops every child and exits 1 instead of restarting it forever."""

EXIT_JOBS_ABANDONED = 4
"""Exit code of a worker process, and then of the supervisor, that stopped without
finishing the jobs it was running (a second signal, the drain timeout): they run again
once their leases expire."""

EXIT_CHILDREN_FAILING = 5
"""Exit code of a supervisor whose worker processes were failing when it stopped: one
was crashing again and again (twice in a row, each within :data:`STABLE_AFTER` of its
start), or one crashed during the stop."""

_EXIT_USAGE = 2
"""click's exit code for a bad command line: no restart either."""

RESTART_FIRST = 0.5
"""Seconds (upper bound) before the first restart of a crashed worker process."""
RESTART_MAX = 30.0
"""Restarts of a worker process that keeps crashing back off up to this many seconds."""
STABLE_AFTER = 10.0
"""A worker process that ran this long before it crashed restarts after
:data:`RESTART_FIRST` again: it was not crashing at start."""

_PR_SET_PDEATHSIG = 1

PARENT_GONE = signal.SIGHUP
"""The signal a worker process gets when its supervisor dies (Linux's parent-death
signal): "the controlling process died". Linux may send it more than once for one death
(once per thread of the supervisor that exits after the one that started the child), so
a supervised worker drains on it however often it comes, and it never counts as the
second request that cancels running jobs."""


class Supervisor:
    """Runs ``processes`` copies of ``command`` as child processes.

    Guarantees:

    - a child that dies (a signal, an unhandled error, an exit nobody asked for) is
      started again, after a pause that doubles from :data:`RESTART_FIRST` to
      :data:`RESTART_MAX` while it keeps dying young; each restart is logged with the
      exit status;
    - SIGTERM or SIGINT to the supervisor is forwarded to every child as SIGTERM (a
      worker's graceful drain); a second one is forwarded again (the workers cancel
      their handlers); no child is started after a stop;
    - every child started before, during or after a stop gets its SIGTERM: one whose
      start was under way when the stop came is signalled as soon as it is known;
    - :meth:`run` returns once every child has exited: 0 when each of them drained
      and exited cleanly; else 1 when a child exited with :data:`EXIT_DO_NOT_RESTART`
      (which stops the others: the same error would stop them all); else
      :data:`EXIT_JOBS_ABANDONED` when a child abandoned running jobs; else
      :data:`EXIT_CHILDREN_FAILING` (a child kept crashing until the stop, or crashed
      during it).

    Children get a process group of their own, so a Ctrl-C in a terminal reaches the
    supervisor only (which forwards it once), and on Linux they are sent
    :data:`PARENT_GONE` if the supervisor itself dies.
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        restart_first: float = RESTART_FIRST,
        restart_max: float = RESTART_MAX,
        stable_after: float = STABLE_AFTER,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes!r}")
        self.command = list(command)
        self.processes = processes
        self._restart_first = restart_first
        self._restart_max = restart_max
        self._stable_after = stable_after
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()
        self._stops = 0
        self._stopped_at = 0.0
        self._failed = False
        self._abandoned = False
        self._failing = False

    @property
    def pids(self) -> list[int]:
        """Process ids of the children running now."""
        return [child.pid for child in self._children.values() if child.returncode is None]

    async def run(self) -> int:
        """Start the children and keep them running until a stop; 0 when all drained."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
        try:
            await asyncio.gather(*(self._keep(index) for index in range(self.processes)))
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        logger.info("all worker processes exited", extra={"failed": self._failed})
        if self._failed:
            return 1
        if self._abandoned:
            return EXIT_JOBS_ABANDONED
        return EXIT_CHILDREN_FAILING if self._failing else 0

    def stop(self) -> None:
        """Forward SIGTERM to every running child; start none from now on."""
        if not self._stopping.is_set():
            self._stopped_at = asyncio.get_running_loop().time()
        self._stopping.set()
        self._stops += 1
        for child in self._children.values():
            if child.returncode is None:
                child.send_signal(signal.SIGTERM)

    async def _keep(self, index: int) -> None:
        """Keep child ``index`` running until the supervisor stops."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(self._restart_first, self._restart_max)
        crashes = 0  # in a row, each within stable_after of its start
        setup = functools.partial(_child_setup, os.getpid())
        while not self._stopping.is_set():
            child = await asyncio.create_subprocess_exec(*self.command, preexec_fn=setup)
            self._children[index] = child
            # A stop handled while the child was being started (after its fork) did not
            # see it: give it the SIGTERMs it missed.
            for _ in range(self._stops):
                child.send_signal(signal.SIGTERM)
            started = loop.time()
            logger.info("worker process %d started (pid %d)", index, child.pid)
            code = await child.wait()
            if self._stopping.is_set():
                if self._stopped_at - started >= self._stable_after:
                    crashes = 0
                if code == EXIT_JOBS_ABANDONED:
                    self._abandoned = True
                # -SIGTERM: killed by the forwarded SIGTERM before its worker installed
                # handlers (still importing): it had no job to drain.
                elif code not in (0, -signal.SIGTERM):
                    self._failing = True
                    logger.error("worker process %d exited with %s", index, _status(code))
                break
            if code in (EXIT_DO_NOT_RESTART, _EXIT_USAGE):
                logger.error(
                    "worker process %d stopped on an error a restart cannot fix (%s); "
                    "stopping the others",
                    index,
                    _status(code),
                )
                self._failed = True
                self.stop()
                return
            if loop.time() - started >= self._stable_after:
                backoff.reset()
                crashes = 0
            crashes += 1
            pause = backoff.next()
            logger.warning(
                "worker process %d (pid %d) exited with %s; restarting it in %.1f s",
                index,
                child.pid,
                _status(code),
                pause,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pause)
        if crashes >= 2:
            self._failing = True
            logger.warning("worker process %d was crashing until the stop", index)


def _status(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _child_setup(supervisor: int) -> None:  # pragma: no cover - in the child before exec
    os.setpgid(0, 0)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, PARENT_GONE)
        if os.getppid() != supervisor:
            # The supervisor died before the signal was armed: nothing would send it.
            os.kill(os.getpid(), PARENT_GONE)


async def run_supervised(worker: Worker) -> None:
    """Run ``worker`` in a worker process of a :class:`Supervisor`: when the supervisor
    dies the worker drains as on SIGTERM, once however often :data:`PARENT_GONE` comes;
    a SIGTERM or SIGINT after it is the second request that cancels running jobs."""
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def supervisor_gone() -> None:
        if not draining:
            logger.warning("the supervisor is gone; draining running jobs")
            draining.append(asyncio.create_task(worker.stop()))

    loop.add_signal_handler(PARENT_GONE, supervisor_gone)
    try:
        await worker.run()
    finally:
        loop.remove_signal_handler(PARENT_GONE)
        await asyncio.gather(*draining, return_exceptions=True)
