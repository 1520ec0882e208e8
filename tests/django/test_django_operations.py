"""The rest of the queue from a Django project: limits, pauses and schedules set in the
backend's OPTIONS (checked once, applied by every worker as it starts), their system
check, and the dashboard mounted beside Django's ASGI app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from queuert_notify.errors import ConfigurationError
from tests.django.conftest import Project
from tests.django.project import manage
from tests.support.services import free_port

# The Django project (session scope, tests/django/conftest.py: a database, migrations,
# django.setup()) is built once: one xdist worker runs every Django test.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("django")]


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def finished(result: Any) -> bool:
    result.refresh()
    return bool(result.is_finished)


def test_options_limits_pauses_and_schedules_apply_when_a_worker_starts(
    django_project: Project, postgres_url: str, redis_url: str
) -> None:
    from django.db import connection
    from shop.models import Run
    from shop.tasks import ops_held, ops_tick
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from queuert_notify import RedisNotifyAdapter, SyncClient

    held = ops_held.enqueue("held")
    worker = django_project.start_worker("--backend=ops")
    try:
        # "every": 1 — a tick a second, each enqueuing ops_tick("tick") once.
        wait_until(lambda: Run.objects.filter(key="ops:tick").count() >= 2)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT type_name, paused, concurrency, rate, per_seconds "
                "FROM qops_type_controls ORDER BY type_name"
            )
            controls = cursor.fetchall()
            cursor.execute("SELECT id FROM qops_jobs WHERE type_name = 'django:default' LIMIT 1")
            (tick_id,) = cursor.fetchone()
        assert controls == [
            ("django:held", True, None, None, None),
            ("django:slow", False, 2, 50, 1.0),
        ]
        held.refresh()
        assert held.status == "READY"  # its queue is paused
        # Resumed from code (docs/django.md): the running worker takes it at once.
        database = make_url(postgres_url).set(database=django_project.env["QN_PG_NAME"])
        engine = create_engine(database)
        notify = RedisNotifyAdapter(url=redis_url, prefix=f"{django_project.prefix}ops")
        with SyncClient(engine, notify=notify, table_prefix="qops_") as client:
            client.resume_type("django:held")
        engine.dispose()
        wait_until(lambda: finished(held), timeout=30)
    finally:
        django_project.stop_worker(worker)
    assert held.return_value == "held"
    assert Run.objects.filter(key="ops:held").count() == 1
    # A scheduled job is a task result like any other.
    ticked = ops_tick.get_result(tick_id)
    assert (ticked.status, ticked.return_value, ticked.args) == ("SUCCESSFUL", "tick", ["tick"])


def test_a_schedule_naming_a_missing_task_fails_the_system_check_in_one_line(
    django_project: Project,
) -> None:
    env = {**django_project.env, "QN_BAD_SCHEDULE": "1"}
    checked = manage(django_project.root, env, "check", check=False)
    assert checked.returncode == 1
    problem = (
        "TASKS['ops']['OPTIONS']['schedules']['typo']: no task 'shop.tasks.ops_tock' "
        '(Module "shop.tasks" does not define a "ops_tock" attribute/class)'
    )
    assert f"?: (queuert_notify.E001) {problem}" in checked.stderr
    worker = manage(django_project.root, env, "queuert_worker", "--backend=ops", check=False)
    # The worker runs the system checks first, as Django's commands do.
    assert worker.returncode == 1
    assert f"?: (queuert_notify.E001) {problem}" in worker.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"limits": {"emails": {"concurrency": 0}}},
            "TASKS['default']['OPTIONS']['limits']['emails']: concurrency must be",
        ),
        (
            {"limits": {"emails": {"rate": 10}}},
            "TASKS['default']['OPTIONS']['limits']['emails']: rate and per go together",
        ),
        (
            {"limits": {"emails": {"cuncurrency": 5}}},
            "TASKS['default']['OPTIONS']['limits']['emails'] must be a dict with keys among "
            "concurrency, key_concurrency, per, rate",
        ),
        (
            {"limits": {"emails": {"rate": 10, "per": "1s"}}},
            "TASKS['default']['OPTIONS']['limits']['emails']['per'] must be a positive number "
            "of seconds or a timedelta, got '1s'",
        ),
        (
            {"paused": "emails"},
            "TASKS['default']['OPTIONS']['paused'] must be a list of queue names, got 'emails'",
        ),
        (
            {"schedules": {"nightly": {"task": "app.tasks.report", "cron": "0 3 * *"}}},
            "TASKS['default']['OPTIONS']['schedules']['nightly']: ",
        ),
        (
            {"schedules": {"nightly": {"task": "app.tasks.report"}}},
            "TASKS['default']['OPTIONS']['schedules']['nightly']: schedule 'nightly': pass "
            "exactly one of cron=",
        ),
        (
            {"schedules": {"n": {"task": "report", "every": 60}}},
            "TASKS['default']['OPTIONS']['schedules']['n']['task'] must be the task's module "
            "path ('app.tasks.fn'), got 'report'",
        ),
        (
            {"schedules": {"n": {"task": "a.b", "cron": "0 3 * * *", "timezone": "Mars/Base"}}},
            "TASKS['default']['OPTIONS']['schedules']['n']: ",
        ),
        (
            {"schedules": {"n": {"task": "a.b", "every": 60, "args": [object()]}}},
            "TASKS['default']['OPTIONS']['schedules']['n']: ",
        ),
    ],
)
def test_bad_options_are_one_line_configuration_errors_naming_the_option(
    options: dict[str, Any], message: str
) -> None:
    from queuert_notify.contrib.django.options import BackendOptions

    with pytest.raises(ConfigurationError) as raised:
        BackendOptions.parse("default", options)
    text = str(raised.value)
    assert text.startswith(message)
    assert "\n" not in text


def test_options_take_seconds_or_timedeltas() -> None:
    from queuert_notify.contrib.django.options import BackendOptions, QueueLimits

    parsed = BackendOptions.parse(
        "default",
        {
            "limits": {"a": {"rate": 5, "per": 2}, "b": {"rate": 5, "per": timedelta(minutes=1)}},
            "schedules": {"s": {"task": "a.b", "every": timedelta(hours=1)}},
        },
    )
    assert parsed.limits == {
        "a": QueueLimits(rate=5, per=timedelta(seconds=2)),
        "b": QueueLimits(rate=5, per=timedelta(minutes=1)),
    }
    assert parsed.schedules[0].every == timedelta(hours=1)


TRACED_REQUEST = """
import django
django.setup()
from django.db import transaction
from opentelemetry import trace
from shop.tasks import traced_run

with trace.get_tracer("proj").start_as_current_span("POST /orders"):
    with transaction.atomic():
        result = traced_run.enqueue("traced")
print(result.id)
"""


def spans_in(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_task_run_continues_the_trace_of_the_request_that_enqueued_it(
    django_project: Project, tmp_path: Any
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from shop.tasks import traced_run

    web_spans, worker_spans = tmp_path / "web.jsonl", tmp_path / "worker.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", TRACED_REQUEST],
        cwd=django_project.root,
        env={**os.environ, **django_project.env, "QN_OTEL_SPANS": str(web_spans)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = traced_run.get_result(done.stdout.strip().splitlines()[-1])
    worker = django_project.start_worker(env={"QN_OTEL_SPANS": str(worker_spans)})
    try:
        wait_until(lambda: finished(result), timeout=60)
    finally:
        django_project.stop_worker(worker)
    assert result.return_value == "traced"
    web = {span["name"]: span for span in spans_in(web_spans)}
    request, enqueue = web["POST /orders"], web["start_chains django:default"]
    assert (enqueue["kind"], enqueue["parent_id"]) == ("PRODUCER", request["span_id"])
    ran = {span["name"]: span for span in spans_in(worker_spans)}
    run, inside = ran["run django:default"], ran["inside traced"]
    # One trace from the request to the task's own span, across the two processes.
    assert (run["kind"], run["trace_id"], run["parent_id"]) == (
        "CONSUMER",
        request["trace_id"],
        enqueue["span_id"],
    )
    assert (inside["trace_id"], inside["parent_id"]) == (request["trace_id"], run["span_id"])


@pytest.fixture
def asgi_server(django_project: Project) -> Iterator[str]:
    """The project's ``proj/asgi.py`` (Django at ``/``, the dashboard at ``/queue``)
    served by uvicorn; its base URL."""
    pytest.importorskip("uvicorn")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "proj.asgi:application", f"--port={port}"],
        cwd=django_project.root,
        env={**os.environ, **django_project.env, "QN_DASHBOARD_TOKEN": "s3cret"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    seen = []
    for line in server.stdout:
        seen.append(line)
        if "Uvicorn running" in line:
            break
    else:
        raise AssertionError("uvicorn exited:\n" + "".join(seen))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
        print(output)  # shown when the test fails


def test_the_dashboard_mounted_beside_django_shows_the_tasks_the_views_enqueue(
    asgi_server: str,
) -> None:
    import httpx

    order = httpx.get(f"{asgi_server}/orders", params={"item": "dashboard"}, timeout=30)
    assert order.status_code == 200
    task_id = order.json()["task"]
    assert httpx.get(f"{asgi_server}/queue/", timeout=30).status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    overview = httpx.get(f"{asgi_server}/queue/", headers=auth, timeout=30)
    assert overview.status_code == 200
    assert "django:default" in overview.text
    chain = httpx.get(f"{asgi_server}/queue/chains/{task_id}", headers=auth, timeout=30)
    assert chain.status_code == 200
    assert "shop.tasks.process_order" in chain.text


async def test_an_operator_pauses_and_resumes_a_task_queue_in_the_mounted_dashboard(
    asgi_server: str,
) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    from shop.tasks import other_queue

    from tests.support.browser import chromium

    await other_queue.aenqueue("shown in the dashboard")
    expect = playwright_api.expect
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{asgi_server}/queue/?token=s3cret")
        row = page.locator("tr", has_text="django:other")
        await row.get_by_role("button", name="Pause").click()
        await expect(page.locator("#paused")).to_contain_text("django:other")
        await row.get_by_role("button", name="Resume").click()
        await expect(page.locator("#paused")).to_have_text("none: workers claim every type")
