"""The django.tasks backend in a real Django project: jobs commit with the view's rows,
wakeups follow commits only, a queuert_worker process runs the tasks (Postgres + Redis,
and SQLite), results read back through the Tasks API."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from tests.django.conftest import Project

# The Django project (session scope, tests/django/conftest.py: a database, migrations,
# django.setup()) is built once: one xdist worker runs every Django test.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("django")]


@pytest.fixture
def wakeups(django_project: Project, redis_url: str) -> Iterator[list[str]]:
    """The type names published on the project's wakeup channel while the test runs."""
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(f"{django_project.prefix}:sched")
    pubsub.get_message(timeout=5)  # the subscribe confirmation
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.1)
            if message is not None and message["type"] == "message":
                seen.append(message["data"].decode())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    yield seen
    stop.set()
    reader.join()
    pubsub.close()
    client.close()


def job_count(alias: str = "default") -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM queuert_jobs")
        return int(cursor.fetchone()[0])


def wait_finished(result: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not result.is_finished:
        assert time.monotonic() < deadline, f"task {result.id} still {result.status}"
        time.sleep(0.05)
        result.refresh()
    return result


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_the_backend_declares_what_it_supports(django_project: Project) -> None:
    from shop.tasks import process_order

    backend = process_order.get_backend()
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_a_view_that_raises_after_enqueueing_leaves_no_row_no_job_and_no_wakeup(
    django_project: Project, wakeups: list[str]
) -> None:
    from django.test import Client
    from shop.models import Order
    from shop.tasks import count_run

    jobs = job_count()
    with pytest.raises(RuntimeError, match="after enqueueing"):
        Client().get("/orders", {"item": "rolled-back", "fail": "1"})
    assert not Order.objects.filter(item="rolled-back").exists()
    assert job_count() == jobs
    # A committed enqueue afterwards: its wakeup is the only one (commit order).
    count_run.enqueue("after-rollback")
    wait_until(lambda: len(wakeups) >= 1, timeout=10)
    time.sleep(0.2)
    assert wakeups == ["django:default"]


def test_a_rolled_back_savepoint_drops_its_job_and_its_wakeup(
    django_project: Project, wakeups: list[str]
) -> None:
    from django.db import transaction
    from shop.tasks import count_run

    from queuert_notify.contrib.django.tasks_api import TaskResultDoesNotExist

    with transaction.atomic():
        kept = count_run.enqueue("kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            dropped = count_run.enqueue("dropped")
            raise RuntimeError("the savepoint rolls back")
    assert count_run.get_result(kept.id).status == "READY"
    with pytest.raises(TaskResultDoesNotExist):
        count_run.get_result(dropped.id)
    wait_until(lambda: len(wakeups) >= 1, timeout=10)
    time.sleep(0.2)
    assert wakeups == ["django:default"]


def test_a_committed_view_job_is_run_by_the_worker_and_its_result_read_back(
    django_project: Project, wakeups: list[str]
) -> None:
    from django.test import Client
    from shop.models import Order
    from shop.tasks import process_order

    worker = django_project.start_worker()
    try:
        response = Client().get("/orders", {"item": "committed"})
        body = response.json()
        result = wait_finished(process_order.get_result(body["task"]))
        assert result.status == "SUCCESSFUL"
        assert result.return_value == {"order": body["order"], "doubled": body["order"] * 2}
        assert Order.objects.get(id=body["order"]).processed
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert result.attempts == 1
        assert result.errors == []
        assert result.task.priority == 10
        wait_until(lambda: len(wakeups) >= 1, timeout=10)
        assert wakeups == ["django:default"]
    finally:
        django_project.stop_worker(worker)


@pytest.mark.timing
def test_a_committed_job_runs_within_a_second_of_the_commit_with_a_60s_poll(
    django_project: Project,
) -> None:
    from django.db import transaction
    from shop.tasks import count_run

    worker = django_project.start_worker()
    try:
        time.sleep(1.0)  # past the worker's first poll: only a wakeup can start the task
        with transaction.atomic():
            result = count_run.enqueue("timed")
        wait_finished(result, timeout=10)
        assert result.finished_at - result.enqueued_at < timedelta(seconds=1)
    finally:
        django_project.stop_worker(worker)


def test_a_thousand_enqueues_from_four_threads_run_once_each_in_two_worker_processes(
    django_project: Project,
) -> None:
    from django.db import connections, transaction
    from shop.models import Run
    from shop.tasks import count_run

    def enqueue(thread: int) -> None:
        try:
            for n in range(250):
                with transaction.atomic():
                    count_run.enqueue(f"bulk:{thread}:{n}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    worker = django_project.start_worker("--concurrency=20", "--processes=2")
    try:
        wait_until(lambda: Run.objects.filter(key__startswith="bulk:").count() >= 1000)
        time.sleep(0.5)
    finally:
        django_project.stop_worker(worker)
    keys = list(Run.objects.filter(key__startswith="bulk:").values_list("key", flat=True))
    assert len(keys) == 1000
    assert len(set(keys)) == 1000


def test_worker_processes_of_a_sigkilled_supervisor_finish_their_tasks(
    django_project: Project,
) -> None:
    from shop.models import Run
    from shop.tasks import slow_run

    results = [slow_run.enqueue(f"orphan:{n}", 3) for n in range(4)]
    supervisor = django_project.start_worker("--concurrency=2", "--processes=2")
    orphans = Run.objects.filter(key__startswith="orphan:")
    wait_until(lambda: orphans.filter(key__endswith=":begun").count() == 4)
    supervisor.kill()
    supervisor.wait()
    # The worker processes drain as on SIGTERM: each task finishes on its first attempt.
    for result in results:
        wait_finished(result)
    assert [(r.status, r.attempts) for r in results] == [("SUCCESSFUL", 1)] * 4
    assert sorted(orphans.values_list("key", flat=True)) == sorted(
        [f"orphan:{n}" for n in range(4)] + [f"orphan:{n}:begun" for n in range(4)]
    )


def test_a_failing_task_retries_with_backoff_then_fails_with_its_error(
    django_project: Project,
) -> None:
    from shop.models import Run
    from shop.tasks import always_fails, fail_twice

    flaky = fail_twice.enqueue("flaky")
    doomed = always_fails.enqueue("doomed")
    worker = django_project.start_worker()
    try:
        wait_finished(flaky)
        wait_finished(doomed)
    finally:
        django_project.stop_worker(worker)
    assert flaky.status == "SUCCESSFUL"
    assert flaky.return_value == 3  # TaskContext.attempt of the third attempt
    runs = list(Run.objects.filter(key__startswith="flaky:").order_by("at"))
    assert [run.key for run in runs] == ["flaky:1", "flaky:2", "flaky:3"]
    # backoff_base 0.05 s, doubling (± 10 %): the retries wait at least that long.
    assert runs[1].at - runs[0].at >= timedelta(seconds=0.045)
    assert runs[2].at - runs[1].at >= timedelta(seconds=0.09)
    # Every failed attempt's error, in order (TaskResult.errors), the last included.
    assert [e.exception_class_path for e in flaky.errors] == ["builtins.ValueError"] * 2
    assert "attempt 1 of flaky fails" in flaky.errors[0].traceback
    assert "attempt 2 of flaky fails" in flaky.errors[1].traceback
    assert doomed.status == "FAILED"
    assert doomed.attempts == 3
    assert len(doomed.errors) == 3
    for error in doomed.errors:
        assert error.exception_class_path == "builtins.LookupError"
        assert error.exception_class is LookupError
        assert "no such thing: doomed" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        doomed.return_value  # noqa: B018
    # The Tasks API's signals: started before every attempt, finished once.
    signals = [
        key for key in Run.objects.filter(key__contains=flaky.id).values_list("key", flat=True)
    ] + list(Run.objects.filter(key__contains=doomed.id).values_list("key", flat=True))
    assert sorted(signals) == sorted(
        [f"started:{flaky.id}:RUNNING"] * 3
        + [f"finished:{flaky.id}:SUCCESSFUL"]
        + [f"started:{doomed.id}:RUNNING"] * 3
        + [f"finished:{doomed.id}:FAILED"]
    )


def test_async_tasks_run_on_the_worker(django_project: Project) -> None:
    from shop.models import Run
    from shop.tasks import async_double

    result = async_double.enqueue(21)
    worker = django_project.start_worker()
    try:
        wait_finished(result)
    finally:
        django_project.stop_worker(worker)
    assert result.return_value == 42
    assert Run.objects.filter(key="async:21").count() == 1


def test_invalid_tasks_and_arguments_are_refused_before_anything_is_written(
    django_project: Project,
) -> None:
    from shop.tasks import count_run

    from queuert_notify.contrib.django.tasks_api import InvalidTask

    jobs = job_count()
    with pytest.raises(TypeError):
        count_run.enqueue(object())
    with pytest.raises(InvalidTask):
        count_run.using(priority=101)
    with pytest.raises(InvalidTask):
        count_run.using(queue_name="nowhere").enqueue("x")
    assert job_count() == jobs


def test_priority_run_after_and_queue_map_onto_the_job(django_project: Project) -> None:
    from django.db import connections
    from django.utils import timezone
    from shop.tasks import count_run, other_queue

    from queuert_notify.contrib.django.tasks_api import TaskResultDoesNotExist

    later = timezone.now() + timedelta(hours=1)
    urgent = count_run.using(priority=50).enqueue("urgent")
    deferred = count_run.using(priority=-50, run_after=later).enqueue("deferred")
    other = other_queue.enqueue("elsewhere")
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT id, priority, type_name, scheduled_at FROM queuert_jobs WHERE id IN "
            "(%s, %s, %s)",
            [urgent.id, deferred.id, other.id],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    # Django runs higher priorities first; the queue runs lower numbers first.
    assert rows[urgent.id][0] == -50
    assert rows[deferred.id][0] == 50
    assert rows[deferred.id][2] == later
    assert rows[other.id][1] == "django:other"
    stored = count_run.get_backend().get_result(deferred.id)
    assert stored.status == "READY"
    assert stored.task.priority == -50
    with pytest.raises(TaskResultDoesNotExist):
        count_run.get_backend().get_result("0" * 32)


def test_arguments_and_run_after_are_stored_exactly_as_given(django_project: Project) -> None:
    # Django's cursor quotes every value into the statement's text: the JSON and the
    # time have to come back as they went in, escapes, offsets and microseconds too.
    from datetime import datetime, timezone

    from django.db import connections
    from shop.tasks import count_run

    args = ["naïve 'quoted' \\ \"x\" \u2603 %s %(name)s", {"nested": [1.5, None, True, -7]}]
    later = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    result = count_run.using(run_after=later).enqueue(*args)
    stored = count_run.get_backend().get_result(result.id)
    assert stored.args == args
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT scheduled_at FROM queuert_jobs WHERE id = %s", [result.id])
        assert cursor.fetchone()[0] == later


def test_sqlite_jobs_commit_with_the_rows_and_run_in_a_worker(
    django_project: Project, wakeups: list[str]
) -> None:
    from django.db import transaction
    from shop.models import Run
    from shop.tasks import lite_count

    jobs = job_count("lite")
    with pytest.raises(RuntimeError), transaction.atomic(using="lite"):
        Run.objects.using("lite").create(key="lite-rolled-back-row")
        lite_count.enqueue("lite-rolled-back")
        raise RuntimeError("rolled back")
    assert job_count("lite") == jobs
    assert not Run.objects.using("lite").filter(key="lite-rolled-back-row").exists()
    with transaction.atomic(using="lite"):
        Run.objects.using("lite").create(key="lite-row")
        result = lite_count.enqueue("lite-key")
    worker = django_project.start_worker("--backend=lite")
    try:
        wait_finished(result)
    finally:
        django_project.stop_worker(worker)
    assert result.return_value == "lite-key"
    assert Run.objects.using("lite").filter(key="lite-key").count() == 1
    wait_until(lambda: len(wakeups) >= 1, timeout=10)
    assert wakeups == ["django:default"]


def test_the_worker_command_refuses_an_unknown_queue_in_one_line(django_project: Project) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "queuert_worker", "--queue=nowhere"],
        cwd=django_project.root,
        env={**os.environ, **django_project.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "CommandError: queue(s) nowhere are not in TASKS['default']['QUEUES'] (default, other)"
    )


def test_aenqueue_and_aget_result_work_from_async_code(django_project: Project) -> None:
    import asyncio

    from shop.tasks import count_run

    async def enqueue_and_read() -> tuple[str, str]:
        result = await count_run.aenqueue("from-async")
        stored = await count_run.aget_result(result.id)
        return result.id, stored.status

    task_id, status = asyncio.run(enqueue_and_read())
    assert status == "READY"
    assert count_run.get_result(task_id).args == ["from-async"]


ON_PSYCOPG2 = """
import django
django.setup()
from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3
from shop.tasks import count_run

assert connection.vendor == "postgresql" and not is_psycopg3
try:
    with transaction.atomic():
        count_run.enqueue("psycopg2-dropped")
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
with transaction.atomic():
    # Values written into the statement's text: quotes, backslashes, %, non-ASCII,
    # negatives (rolled back: the worker below runs the kept one only).
    tricky = ["it's \\ 100% %s \u2603", -7, {"%(x)s": [None, True, -1.5]}]
    stored = count_run.get_result(count_run.enqueue(*tricky).id)
    assert stored.args == tricky, stored.args
    transaction.set_rollback(True)
with transaction.atomic():
    result = count_run.enqueue("psycopg2-kept")
assert count_run.get_result(result.id).args == ["psycopg2-kept"]
print(result.id)
"""


def test_tasks_enqueue_on_django_s_psycopg2_backend_and_run_on_the_worker(
    django_project: Project,
) -> None:
    from shop.models import Run
    from shop.tasks import count_run

    before = job_count()
    done = subprocess.run(
        [sys.executable, "-c", ON_PSYCOPG2],
        cwd=django_project.root,
        env={**os.environ, **django_project.env, "QN_HIDE_PSYCOPG": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip().splitlines()[-1]
    assert job_count() == before + 1  # the rolled-back enqueue left no job
    worker = django_project.start_worker()
    try:
        result = wait_finished(count_run.get_result(task_id))
    finally:
        django_project.stop_worker(worker)
    assert (result.status, result.return_value) == ("SUCCESSFUL", "psycopg2-kept")
    assert Run.objects.filter(key="psycopg2-kept").count() == 1
    assert Run.objects.filter(key="psycopg2-dropped").count() == 0
