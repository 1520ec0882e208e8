from __future__ import annotations

from queuert_notify.contrib.django.tasks_api import task_backends


def noop(n: int) -> int:
    return n


def make_task(backend: str) -> object:
    """``noop`` as a task of ``backend`` (the ``task`` decorator of the installed API)."""
    return task_backends[backend].task_class(func=noop, backend=backend, priority=0)
