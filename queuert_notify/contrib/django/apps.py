"""The Django app: its migration creates the queue's tables, its management command
``queuert_worker`` runs the project's tasks."""

from __future__ import annotations

import importlib

from django.apps import AppConfig


class QueuertConfig(AppConfig):  # type: ignore[misc]
    name = "queuert_notify.contrib.django"
    label = "queuert_notify"
    verbose_name = "queuert-notify"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The Tasks API's system check runs each backend's check() (ours: OPTIONS naming
        # missing tasks or queues). django.tasks registers it on import; the backport
        # only when "django_tasks" is an installed app, which it need not be.
        try:
            importlib.import_module("django.tasks.checks")
        except ImportError:
            importlib.import_module("django_tasks.checks")
