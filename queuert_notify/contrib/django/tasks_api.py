"""The Django Tasks API this backend implements: ``django.tasks`` (Django >= 6.0) or,
on Django 5.2, the ``django-tasks`` backport (module ``django_tasks``), which has the
same classes under the same names except the exception ``InvalidTask``."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import (
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:
    from django_tasks import (
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import (
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def set_field(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen ``TaskResult`` (the API's own backends do the same)."""
    object.__setattr__(result, name, value)
