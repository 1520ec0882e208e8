"""How a Django task is stored as a queue job, and read back as a ``TaskResult``.

=====================  ============================================================
Tasks API              the queue
=====================  ============================================================
``queue_name``         the job type ``django:{queue_name}``: a worker started with
                       ``--queue NAME`` claims that type only; pause, limits and
                       metrics apply per queue
the task function      ``input["task"]``: its module path, resolved by the worker
                       with Django's ``import_string``
``args``/``kwargs``    ``input["args"]``/``input["kwargs"]`` (JSON)
``priority``           the job's priority negated: Django runs higher numbers first,
                       the queue lower numbers first
``run_after``          the job's ``run_at``
``TaskResult.id``      the chain id (a task's chain has one job, whose id it is too)
``status``             pending/blocked: READY (a retry waiting too), running: RUNNING,
                       completed: SUCCESSFUL, failed/cancelled: FAILED
``return_value``       the job's output (the task's return value, normalized to JSON)
``errors``             every failed attempt's error, in order: the worker keeps them
                       in the job's progress (the queue's ``last_error`` stands in
                       for an attempt that ended without the worker: a lease that
                       expired, a killed process)
``enqueued_at``        the job's ``created_at``
``started_at``,        when the latest attempt started (written by the worker as the
``last_attempted_at``  job's progress)
``finished_at``        the job's ``completed_at``
``worker_ids``         the worker of the latest attempt, once per attempt (so
                       ``attempts`` and ``TaskContext.attempt`` are the job's attempt)
=====================  ============================================================
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import import_string

from queuert_notify.contrib.django.tasks_api import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    set_field,
)
from state_adapters.model import JobRecord

TYPE_PREFIX = "django:"

_STATUSES = {
    "blocked": TaskResultStatus.READY,
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def type_name(queue_name: str) -> str:
    """The job type of a task queue."""
    return f"{TYPE_PREFIX}{queue_name}"


def job_input(task: Task, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The job's input for a call of ``task`` (args already normalized to JSON)."""
    return {"task": task.module_path, "args": args, "kwargs": kwargs}


def queue_priority(django_priority: int) -> int:
    """Django: -100..100, higher first; the queue: lower first."""
    return -django_priority


def resolve_task(module_path: str) -> Task:
    """The task a job names; ``ImportError`` when it is gone or not a task."""
    found = import_string(module_path)
    if not isinstance(found, Task):
        raise ImportError(f"{module_path} is a {type(found).__name__}, not a task")
    return found


def started(worker_id: str) -> dict[str, str]:
    """The progress a worker writes as an attempt starts."""
    return {"started_at": timezone.now().isoformat(), "worker_id": worker_id}


def task_result(job: JobRecord, backend: str) -> TaskResult:
    """The ``TaskResult`` of a stored job; ``TaskResultDoesNotExist`` for a job that
    is not a task of this backend or whose task can no longer be imported."""
    payload = job.input
    if not job.type_name.startswith(TYPE_PREFIX) or not isinstance(payload, dict):
        raise TaskResultDoesNotExist(f"{job.id} is not a task result")
    try:
        task = resolve_task(payload["task"])
    except ImportError as exc:
        raise TaskResultDoesNotExist(f"task result {job.id}: {exc}") from None
    task = task.using(
        priority=-job.priority, queue_name=job.type_name[len(TYPE_PREFIX) :], backend=backend
    )
    status = _STATUSES[job.status]
    progress = job.progress if isinstance(job.progress, dict) else {}
    started_at = _time(progress.get("started_at"))
    worker = progress.get("worker_id") or job.leased_by or ""
    result = TaskResult(
        task=task,
        id=job.id,
        status=status,
        enqueued_at=_local(job.created_at),
        started_at=started_at,
        finished_at=_local(job.completed_at),
        last_attempted_at=started_at,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=backend,
        errors=_errors(job, progress),
        worker_ids=[worker] * job.attempt,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        set_field(result, "_return_value", job.output)
    return result


def stored_error(attempt: int, error: TaskError) -> dict[str, Any]:
    """An attempt's error as the worker keeps it in the job's progress."""
    return {
        "attempt": attempt,
        "exception_class_path": error.exception_class_path,
        "traceback": error.traceback,
    }


def _errors(job: JobRecord, progress: dict[str, Any]) -> list[TaskError]:
    stored = progress.get("errors") or []
    errors = [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in stored
    ]
    # The latest attempt ended without the worker writing its error (a lease that
    # expired, a killed process, a task that could not be imported): the queue's own.
    ended = job.status in {"pending", "blocked", "failed", "cancelled"}
    if ended and job.last_error and all(e.get("attempt") != job.attempt for e in stored):
        errors.append(error_of(job.last_error))
    return errors


def error_of(text: str) -> TaskError:
    """A failed attempt's traceback as a ``TaskError``: the exception's class path is
    the traceback's last line up to the colon (``builtins.`` for built-in ones)."""
    last = text.rstrip().rsplit("\n", 1)[-1]
    name = last.split(":", 1)[0].strip()
    if "." not in name:
        name = f"builtins.{name}"
    return TaskError(exception_class_path=name, traceback=text)


def _time(value: str | None) -> datetime | None:
    return None if value is None else _local(datetime.fromisoformat(value))


def _local(value: datetime | None) -> datetime | None:
    """Aware UTC times, or naive local ones when ``USE_TZ`` is off (as Django's own)."""
    if value is None or settings.USE_TZ:
        return value
    naive: datetime = timezone.make_naive(value)
    return naive
