"""``QueuertTaskBackend``: Django's Tasks API on the queue.

``task.enqueue()`` writes the job through the Django connection of the backend's
database alias (``OPTIONS["database"]``, default ``"default"``), inside the current
``transaction.atomic()`` block when there is one — the job commits or rolls back
with the application's rows — and in a transaction of its own otherwise. The wakeup
is handed to the notify adapter's blocking publisher by ``transaction.on_commit``:
never for a rolled-back transaction or savepoint.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import cached_property, partial
from typing import Any

from django.core import checks
from django.db import connections, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.sync_announcers import announcer_for
from queuert_notify.contrib.django.controls import problems
from queuert_notify.contrib.django.options import BackendOptions
from queuert_notify.contrib.django.statements import QueueTables, queue_tables
from queuert_notify.contrib.django.task_jobs import (
    job_input,
    queue_priority,
    task_result,
    type_name,
)
from queuert_notify.contrib.django.tasks_api import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from queuert_notify.errors import ChainNotFoundError, JobNotFoundError
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
from queuert_notify.observe import instrumentation
from state_adapters.ids import new_id
from state_adapters.notifications import NotificationBuffer
from state_adapters.sync.bridge import run_to_completion
from state_adapters.sync.state import Announcer


class QueuertTaskBackend(BaseTaskBackend):  # type: ignore[misc]
    """A ``TASKS`` backend storing tasks as queue jobs (see
    :mod:`queuert_notify.contrib.django.task_jobs` for the mapping and
    :mod:`queuert_notify.contrib.django.options` for ``OPTIONS``)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = BackendOptions.parse(alias, self.options)
        self._announcer = _announcer(self.settings.redis_url, self.settings.redis_prefix)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the task's job in the database alias's current transaction (or one of
        its own). Invalid tasks raise ``InvalidTask``, arguments that are not JSON
        ``TypeError``/``ValueError``, both before anything is written."""
        self.validate_task(task)
        now = datetime.now(UTC)
        result = TaskResult(
            task=task,
            id=new_id(),
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        spec = ChainSpec(
            type_name=type_name(task.queue_name),
            input=job_input(task, result.args, result.kwargs),
            run_at=task.run_after,
            priority=queue_priority(task.priority),
            max_attempts=self.settings.max_attempts,
        )
        alias = self.settings.database
        with instrumentation.active().starting_chains([spec]) as observed:
            chain = spec.to_new_chain(result.id, trace_context=observed.trace_context)
            notes = NotificationBuffer()
            connection = connections[alias]
            with _in_transaction(connection, alias):
                tables = self._queue_tables
                with connection.cursor() as cursor:
                    conn = tables.on(cursor)
                    started = run_to_completion(
                        tables.state.start_chains([chain], notes=notes, session=conn)
                    )
                if notes:
                    connection.on_commit(partial(self._announcer.after_commit, notes, _committed))
            observed.started(started)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id."""
        alias = self.settings.database
        tables = self._queue_tables
        with connections[alias].cursor() as cursor:
            try:
                job = run_to_completion(
                    tables.state.get_job(result_id, session=tables.reading(cursor))
                )
            except (JobNotFoundError, ChainNotFoundError):
                raise TaskResultDoesNotExist(f"no task result with id {result_id!r}") from None
        return task_result(job, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system check (``manage.py check``, ``runserver``, ``migrate``): the
        ``OPTIONS`` that name a task or a queue that is not there (``queuert_notify.E001``)."""
        messages = list(super().check(**kwargs))
        for problem in problems(self.alias, self.settings, self.queues):
            messages.append(checks.Error(problem, id="queuert_notify.E001"))
        return messages

    @cached_property
    def _queue_tables(self) -> QueueTables:
        """The statements for the alias's database (its vendor and driver are fixed)."""
        connection = connections[self.settings.database]
        psycopg2 = connection.vendor == "postgresql" and not is_psycopg3
        return queue_tables(
            connection.vendor, table_prefix=self.settings.table_prefix, psycopg2=psycopg2
        )


_announcers: dict[tuple[str, str], Announcer] = {}
_announcers_lock = threading.Lock()


def _announcer(redis_url: str | None, prefix: str) -> Announcer:
    """One publisher (and sender thread) per Redis server and prefix for the process:
    Django makes a backend per thread."""
    if redis_url is None:
        return Announcer()
    with _announcers_lock:
        announcer = _announcers.get((redis_url, prefix))
        if announcer is None:
            notify = RedisNotifyAdapter(url=redis_url, prefix=prefix)
            announcer = _announcers[(redis_url, prefix)] = announcer_for(notify)
    return announcer


def _in_transaction(connection: Any, alias: str) -> AbstractContextManager[Any]:
    """The enqueue's transaction: the current atomic block when there is one (an error
    marks it for rollback, as Django's own ``save()`` does: no savepoint to pay for),
    else one of its own."""
    block: AbstractContextManager[Any] = (
        transaction.mark_for_rollback_on_error(using=alias)
        if connection.in_atomic_block
        else transaction.atomic(using=alias)
    )
    return block


def _committed() -> bool:
    return True
