"""Integrations with web frameworks (``contrib.django``: the ``django.tasks`` backend)."""
