"""Django integration: a ``django.tasks`` backend whose jobs commit with the app's rows.

``INSTALLED_APPS += ["queuert_notify.contrib.django"]`` (its migration creates the
queue's tables), ``TASKS = {"default": {"BACKEND":
"queuert_notify.contrib.django.QueuertTaskBackend", "OPTIONS": {...}}}``, workers with
``python manage.py queuert_worker``. See docs/django.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queuert_notify.contrib.django.backend import QueuertTaskBackend

__all__ = ["QueuertTaskBackend"]


def __getattr__(name: str) -> Any:
    # Imported on first use: INSTALLED_APPS imports this package before the app
    # registry is ready, and the backend needs Django's database layer.
    if name == "QueuertTaskBackend":
        from queuert_notify.contrib.django.backend import QueuertTaskBackend

        return QueuertTaskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
