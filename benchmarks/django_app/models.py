from __future__ import annotations

from django.db import models


class Row(models.Model):  # type: ignore[misc]
    """A row like an application's: a primary key and one short text column."""

    name = models.CharField(max_length=100)

    class Meta:
        app_label = "django_app"
