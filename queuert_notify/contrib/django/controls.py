"""What ``OPTIONS`` sets on the queue: limits, pauses and schedules.

Limits and pauses are stored in the database; every ``queuert_worker`` applies the
backend's as it starts (before it claims anything), so settings win over earlier
changes made from the command line or from code for the queues they name, and queues
they do not name keep whatever was set. Schedules ride in every worker of the backend
(the queue starts exactly one job per tick however many run them). What settings
alone cannot tell — does a schedule's task exist, is it a task of this backend, are
the named queues the backend's — is checked by :func:`problems`, which both the
system check (``manage.py check``) and the worker's start run.
"""

from __future__ import annotations

from collections.abc import Set

from queuert_notify.client.client import Client
from queuert_notify.contrib.django.options import (
    BackendOptions,
    TaskSchedule,
    as_queue_schedule,
)
from queuert_notify.contrib.django.task_jobs import job_input, resolve_task, type_name
from queuert_notify.contrib.django.tasks_api import normalize_json
from queuert_notify.errors import ConfigurationError, InvalidInputError
from queuert_notify.maintenance.schedules import Schedule


def problems(alias: str, options: BackendOptions, queues: Set[str]) -> list[str]:
    """One line for each setting of ``OPTIONS`` that names something that is not there."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    found: list[str] = []
    named = [(f"['limits'][{q!r}]", q) for q in options.limits]
    named += [(f"['paused'] {q!r}", q) for q in options.paused]
    for place, queue in named:
        if queues and queue not in queues:
            found.append(
                f"{where}{place} is not a queue of TASKS[{alias!r}]['QUEUES'] "
                f"({', '.join(sorted(queues))})"
            )
    for schedule in options.schedules:
        try:
            queue_schedule(alias, options, queues, schedule)
        except ConfigurationError as exc:
            found.append(str(exc))
    return found


def queue_schedules(alias: str, options: BackendOptions, queues: Set[str]) -> list[Schedule]:
    """The queue's schedules of ``OPTIONS["schedules"]``, their tasks imported."""
    return [queue_schedule(alias, options, queues, s) for s in options.schedules]


def queue_schedule(
    alias: str, options: BackendOptions, queues: Set[str], schedule: TaskSchedule
) -> Schedule:
    """The queue's ``Schedule`` for ``schedule``; ``ConfigurationError`` naming it when
    its task cannot be imported or belongs to another backend or queue."""
    where = f"TASKS[{alias!r}]['OPTIONS']['schedules'][{schedule.name!r}]"
    try:
        task = resolve_task(schedule.task)
    except ImportError as exc:
        raise ConfigurationError(f"{where}: no task {schedule.task!r} ({exc})") from None
    if task.backend != alias:
        raise ConfigurationError(
            f"{where}: {schedule.task} is a task of backend {task.backend!r}, not {alias!r}"
        )
    if queues and task.queue_name not in queues:
        raise ConfigurationError(
            f"{where}: {schedule.task} is in queue {task.queue_name!r}, not in "
            f"TASKS[{alias!r}]['QUEUES'] ({', '.join(sorted(queues))})"
        )
    try:
        input = job_input(
            task, normalize_json(list(schedule.args)), normalize_json(dict(schedule.kwargs))
        )
        return as_queue_schedule(schedule, type_name(task.queue_name), input, options.max_attempts)
    except (TypeError, ValueError, InvalidInputError) as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


async def apply_controls(client: Client, options: BackendOptions) -> None:
    """Set the limits of ``OPTIONS["limits"]`` and pause the queues of ``OPTIONS["paused"]``."""
    for queue, limits in options.limits.items():
        await client.set_limits(
            type_name(queue),
            concurrency=limits.concurrency,
            key_concurrency=limits.key_concurrency,
            rate=limits.rate,
            per=limits.per,
        )
    for queue in options.paused:
        await client.pause_type(type_name(queue))
