"""The maintenance services one worker runs beside its loop: the reaper and its row in
the worker registry always, the scheduler when the worker has schedules, the pruner
when it has a retention. Each is a timer of its own and leaderless (every worker runs
them; the database decides)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta

from queuert_notify.client.client import Client
from queuert_notify.maintenance.pruner import Pruner
from queuert_notify.maintenance.reaper import Reaper
from queuert_notify.maintenance.registration import Registration
from queuert_notify.maintenance.schedules import Schedule, Scheduler


class MaintenanceServices:
    """One worker's services, started by :meth:`start` as tasks the worker cancels
    when its run ends. ``reaped(job_id)`` and ``woke()`` are the reaper's
    (:class:`~queuert_notify.maintenance.reaper.Reaper`)."""

    def __init__(
        self,
        client: Client,
        type_names: Sequence[str],
        *,
        reap_interval: float,
        jitter: float,
        schedules: Sequence[Schedule],
        retention: timedelta | None,
        reaped: Callable[[str], None],
        woke: Callable[[], None],
        worker_id: str,
        slots: int,
    ) -> None:
        self._reaper = Reaper(
            client,
            type_names,
            interval=reap_interval,
            jitter=jitter,
            reaped=reaped,
            woke=woke,
            worker_id=worker_id,
        )
        self._registration = Registration(
            client.state, type_names, slots=slots, interval=reap_interval, worker_id=worker_id
        )
        self._scheduler = Scheduler(client, schedules, worker_id=worker_id) if schedules else None
        self._pruner = (
            Pruner(client, retention, jitter=jitter, worker_id=worker_id)
            if retention is not None
            else None
        )

    def start(self) -> list[asyncio.Task[None]]:
        """A task per service, running until cancelled."""
        tasks = [
            asyncio.create_task(self._reaper.run(), name="queuert-reaper"),
            asyncio.create_task(self._registration.run(), name="queuert-registration"),
        ]
        if self._scheduler is not None:
            tasks.append(asyncio.create_task(self._scheduler.run(), name="queuert-scheduler"))
        if self._pruner is not None:
            tasks.append(asyncio.create_task(self._pruner.run(), name="queuert-pruner"))
        return tasks
