"""The Django app of the ``django-enqueue`` benchmark: one model and one task."""
