"""The Django app: its migration creates the queue's tables, its management command
``queuert_worker`` runs the project's tasks."""

from __future__ import annotations

from django.apps import AppConfig


class QueuertConfig(AppConfig):  # type: ignore[misc]
    name = "queuert_notify.contrib.django"
    label = "queuert_notify"
    verbose_name = "queuert-notify"
    default_auto_field = "django.db.models.BigAutoField"
