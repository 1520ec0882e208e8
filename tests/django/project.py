"""A real Django project, written to a directory by the tests: settings, an app with
models, tasks and views, and ``manage.py``. Both databases at once: ``default`` on
Postgres (task backend ``default``) and ``lite`` on a SQLite file (backend ``lite``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SETTINGS = """
import os
import sys

if os.environ.get("QN_HIDE_PSYCOPG"):
    # Django's Postgres backend then runs on psycopg2 (it takes psycopg 3 when it can).
    sys.modules["psycopg"] = None

SECRET_KEY = "test"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "proj.urls"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "queuert_notify.contrib.django", "shop"]
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.insert(0, "django_tasks")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["QN_PG_NAME"],
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    },
    "lite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["QN_SQLITE_PATH"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30,
                    "init_command": "PRAGMA journal_mode=WAL"},
    },
}
DATABASE_ROUTERS = ["shop.routers.Router"]
_queue = {"redis_url": os.environ["QN_REDIS_URL"], "redis_prefix": os.environ["QN_PREFIX"],
          "table_prefix": "queuert_", "backoff_base": 0.05, "backoff_cap": 0.2,
          "max_attempts": 3}
TASKS = {
    "default": {"BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
                "QUEUES": ["default", "other"], "OPTIONS": _queue},
    "lite": {"BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
             "OPTIONS": {**_queue, "database": "lite"}},
    # Limits, a pause and a schedule from OPTIONS, on tables and a Redis prefix of their own.
    "ops": {"BACKEND": "queuert_notify.contrib.django.QueuertTaskBackend",
            "QUEUES": ["default", "held", "slow"],
            "OPTIONS": {**_queue, "table_prefix": "qops_",
                        "redis_prefix": os.environ["QN_PREFIX"] + "ops",
                        "limits": {"slow": {"concurrency": 2, "rate": 50, "per": 1}},
                        "paused": ["held"],
                        "schedules": {"ops-tick": {"task": "shop.tasks.ops_tick",
                                                   "every": 1, "args": ["tick"]}}}},
}
if os.environ.get("QN_OTEL_SPANS"):
    # OpenTelemetry as docs/django.md sets it up, spans written to a file per process.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from proj.spans import FileExporter
    from queuert_notify.otel import instrument

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["QN_OTEL_SPANS"])))
    trace.set_tracer_provider(_provider)
    instrument()
if os.environ.get("QN_BAD_SCHEDULE"):
    TASKS["ops"]["OPTIONS"]["schedules"]["typo"] = {"task": "shop.tasks.ops_tock", "every": 60}
"""

SPANS = """
import json

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    \"\"\"Each finished span as a JSON line: name, kind, trace and parent ids, task name.\"\"\"

    def __init__(self, path):
        self.path = path

    def export(self, spans):
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": span.context.trace_id,
                    "span_id": span.context.span_id,
                    "parent_id": span.parent.span_id if span.parent else None,
                }) + "\\n")
        return SpanExportResult.SUCCESS
"""

ASGI = """
import os

from django.core.asgi import get_asgi_application
from starlette.applications import Starlette
from starlette.routing import Mount

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
django_app = get_asgi_application()

from queuert_notify.contrib.django.dashboard import dashboard_app  # noqa: E402

application = Starlette(
    routes=[
        Mount("/queue", dashboard_app(token=os.environ["QN_DASHBOARD_TOKEN"])),
        Mount("/", django_app),
    ]
)
"""

MODELS = '''
from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    processed = models.BooleanField(default=False)


class Run(models.Model):
    """One row per task run: a task that ran twice shows twice."""
    key = models.CharField(max_length=100)
    at = models.DateTimeField(auto_now_add=True)
'''

ROUTERS = '''
class Router:
    """Every model lives in both databases."""

    def allow_migrate(self, db, app_label, **hints):
        return True
'''

TASKS = """
import time

from django.dispatch import receiver

try:
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
except ImportError:
    from django_tasks import task
    from django_tasks.signals import task_finished, task_started

from shop.models import Order, Run


@receiver(task_started)
def record_start(sender, task_result, **kwargs):
    Run.objects.create(key=f"started:{task_result.id}:{task_result.status}")


@receiver(task_finished)
def record_finish(sender, task_result, **kwargs):
    Run.objects.create(key=f"finished:{task_result.id}:{task_result.status}")


@task(priority=10)
def process_order(order_id):
    Order.objects.filter(id=order_id).update(processed=True)
    return {"order": order_id, "doubled": order_id * 2}


@task
def count_run(key):
    Run.objects.create(key=key)
    return key


@task(takes_context=True)
def fail_twice(context, key):
    Run.objects.create(key=f"{key}:{context.attempt}")
    if context.attempt < 3:
        raise ValueError(f"attempt {context.attempt} of {key} fails")
    return context.attempt


@task
def always_fails(key):
    raise LookupError(f"no such thing: {key}")


@task
async def async_double(n):
    await Run.objects.acreate(key=f"async:{n}")
    return n * 2


@task(backend="lite")
def lite_count(key):
    Run.objects.using("lite").create(key=key)
    return key


@task(queue_name="other")
def other_queue(key):
    return key


@task(backend="ops")
def ops_tick(key):
    Run.objects.create(key=f"ops:{key}")
    return key


@task(backend="ops", queue_name="held")
def ops_held(key):
    Run.objects.create(key=f"ops:{key}")
    return key


@task
def traced_run(key):
    # A span of the task's own nests under the worker's run span.
    from opentelemetry import trace

    with trace.get_tracer("shop").start_as_current_span(f"inside {key}"):
        Run.objects.create(key=key)
    return key


@task
def slow_run(key, seconds):
    Run.objects.create(key=f"{key}:begun")
    time.sleep(seconds)
    Run.objects.create(key=key)
    return key
"""

VIEWS = """
from django.db import transaction
from django.http import JsonResponse

from shop.models import Order
from shop.tasks import process_order


def create_order(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.GET["item"])
        result = process_order.enqueue(order.id)
        if request.GET.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return JsonResponse({"order": order.id, "task": result.id})
"""

URLS = """
from django.urls import path

from shop.views import create_order

urlpatterns = [path("orders", create_order)]
"""

MANAGE = """
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""


def write_project(root: Path) -> None:
    """The project's files under ``root`` (``manage.py``, ``proj/``, ``shop/``)."""
    files = {
        "manage.py": MANAGE,
        "proj/__init__.py": "",
        "proj/settings.py": SETTINGS,
        "proj/urls.py": URLS,
        "proj/asgi.py": ASGI,
        "proj/spans.py": SPANS,
        "shop/__init__.py": "",
        "shop/models.py": MODELS,
        "shop/routers.py": ROUTERS,
        "shop/tasks.py": TASKS,
        "shop/views.py": VIEWS,
        "shop/migrations/__init__.py": "",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def manage(
    root: Path, env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` in the project (``env`` added to this process's); with
    ``check`` a failure is an ``AssertionError`` showing its output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=root,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done
