"""A worker's running jobs and the concurrency slots their handlers hold."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator

from queuert_notify.worker.job_run import JobRun

logger = logging.getLogger(__name__)


class Slots:
    """The worker's runs, by lease token, and the ``concurrency`` slots they hold.

    A run takes a slot when it is claimed (:meth:`take`) and gives it back once its
    handler finished (:meth:`release`): the next job starts while this one's outcome is
    written. It stays among the runs until that write is done (:meth:`remove`). A run
    claimed ahead of a free slot waits (:meth:`wait`, leased, its lease renewed) until
    :meth:`next_waiting` gives it one, in claim order. At most ``concurrency`` handlers
    run, and at most ``3 * concurrency`` runs are held at once (runs waiting, a batch
    of completions in flight and the next), so a slow database slows claiming down
    instead of queueing completions without bound.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._runs: dict[str, JobRun] = {}
        self._waiting: deque[JobRun] = deque()
        self._busy = 0  # runs whose handler has not finished
        self.abandoned = 0
        """Runs given up on by :meth:`abandon_all` before they ended."""

    def free(self) -> int:
        """Handlers that may start now."""
        # Called a few times per job: a comparison, not min().
        idle, room = self.concurrency - self._busy, 3 * self.concurrency - len(self._runs)
        return idle if idle < room else room

    @property
    def waiting(self) -> int:
        """Runs claimed ahead, waiting for a slot."""
        return len(self._waiting)

    def room_ahead(self) -> int:
        """How many jobs a claim may take beyond the free slots, to wait for one: up to
        ``concurrency`` wait, and room is made again once half of them started. One
        claim's round trip then serves about ``concurrency`` runs, not just the slots
        freed during the last one. A waiting run's lease is renewed (the lease keeper)
        and fences its writes as a running one's."""
        waiting = len(self._waiting)
        return self.concurrency - waiting if waiting <= self.concurrency // 2 else 0

    def take(self, run: JobRun) -> None:
        """``run`` was claimed: it holds a slot until :meth:`release`."""
        self._runs[run.lease_token] = run
        self._busy += 1

    def wait(self, run: JobRun) -> None:
        """``run`` was claimed ahead of a free slot: it waits for :meth:`next_waiting`."""
        self._runs[run.lease_token] = run
        run.holds_slot = False
        self._waiting.append(run)

    def next_waiting(self) -> JobRun | None:
        """The run that waited longest, now holding a slot (``None``: no run waits, or
        no slot is free)."""
        if not self._waiting or self.free() <= 0:
            return None
        run = self._waiting.popleft()
        run.holds_slot = True
        self._busy += 1
        return run

    def release(self, run: JobRun) -> bool:
        """``run``'s handler finished: give its slot back (once). True when no slot was
        free before, so a loop sleeping for one should wake."""
        if not run.holds_slot:
            return False
        was_full = self.free() <= 0
        run.holds_slot = False
        self._busy -= 1
        return was_full

    def remove(self, run: JobRun) -> bool:
        """``run`` is over (its outcome written or given up): forget it and free its
        slot if it still holds one. True when no slot was free before."""
        was_full = self.free() <= 0
        self._runs.pop(run.lease_token, None)
        self.release(run)
        return was_full

    def __iter__(self) -> Iterator[JobRun]:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)

    def tasks(self) -> set[asyncio.Task[None]]:
        """The tasks of the runs held."""
        return {run.task for run in self._runs.values() if run.task is not None}

    def job_ids(self) -> list[str]:
        """The ids of the jobs running."""
        return [run.job.id for run in self._runs.values()]

    def abandon_all(self, reason: str) -> None:
        """The worker stops: every run keeps its lease until it expires, then runs again;
        each one given up on (runs waiting for a slot too) is one WARNING line naming the
        job and its type."""
        for run in self._waiting:
            self._runs.pop(run.lease_token, None)
        waiting, self._waiting = list(self._waiting), deque()
        for run in [*self._runs.values(), *waiting]:
            # An ended run waits only for its done callback to remove it.
            if not run.abandoned and (run.task is None or not run.task.done()):
                self.abandoned += 1
                logger.warning(
                    "abandoned job %s of type %r (%s); it runs again once its lease expires",
                    run.job.id,
                    run.job.type_name,
                    reason,
                    extra={"job_id": run.job.id, "type_name": run.job.type_name},
                )
            run.abandon(reason)
