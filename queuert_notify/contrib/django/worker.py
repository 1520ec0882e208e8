"""The asyncio worker that runs a Django project's tasks (``manage.py queuert_worker``).

One handler per task queue (job type ``django:{queue}``): it resolves the task by the
module path stored with the job, writes when the attempt started, and runs the task
function with Django's database connections closed and reopened around it as Django
does around a request (``close_old_connections``): a plain function in a thread, a
coroutine function on the worker's loop. A task that raises is retried with the
queue's backoff until ``max_attempts``, then FAILED, every attempt's error kept with the
job (see :mod:`~queuert_notify.contrib.django.task_jobs`); a job whose
task cannot be imported fails at once. The Tasks API's ``task_started`` signal is sent
before every attempt, ``task_finished`` after a success and after the last failed
attempt, on the thread (or loop) the task runs on.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Sequence
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.utils import timezone
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.contrib.django.backend import QueuertTaskBackend
from queuert_notify.contrib.django.controls import apply_controls, problems, queue_schedules
from queuert_notify.contrib.django.databases import engine_url
from queuert_notify.contrib.django.options import BackendOptions
from queuert_notify.contrib.django.task_jobs import (
    error_of,
    resolve_task,
    started,
    stored_error,
    task_result,
    type_name,
)
from queuert_notify.contrib.django.tasks_api import (
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    set_field,
    task_backends,
    task_finished,
    task_started,
)
from queuert_notify.errors import ConfigurationError
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
from queuert_notify.worker.supervisor import run_supervised
from queuert_notify.worker.worker import Worker
from state_adapters.model import JobRecord
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


def backend_named(alias: str) -> QueuertTaskBackend:
    """The ``TASKS`` backend ``alias``; ``ConfigurationError`` unless it is this one."""
    backend = task_backends[alias]
    if not isinstance(backend, QueuertTaskBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is a {type(backend).__name__}, not "
            "queuert_notify.contrib.django.QueuertTaskBackend"
        )
    return backend


def build_worker(
    backend_alias: str,
    queues: Sequence[str] = (),
    *,
    concurrency: int = 10,
    poll_interval: float | None = None,
) -> tuple[Worker, AsyncEngine]:
    """A worker for the backend's ``queues`` (all of its ``QUEUES`` when empty) on an
    engine of the backend's database, and that engine (dispose it after the run)."""
    backend = backend_named(backend_alias)
    options = backend.settings
    queues = list(queues) or sorted(backend.queues)
    unknown = sorted(set(queues) - backend.queues) if backend.queues else []
    if unknown:
        raise ConfigurationError(
            f"queue(s) {', '.join(unknown)} are not in TASKS[{backend_alias!r}]['QUEUES'] "
            f"({', '.join(sorted(backend.queues))})"
        )
    found = problems(backend_alias, options, backend.queues)
    if found:
        raise ConfigurationError(found[0])
    schedules = queue_schedules(backend_alias, options, backend.queues)
    url = engine_url(connections[options.database].settings_dict, asynchronous=True)
    engine = create_async_engine(url)
    state = SqlAlchemyStateAdapter(
        engine,
        table_prefix=options.table_prefix,
        backoff_base=options.backoff_base,
        backoff_cap=options.backoff_cap,
    )
    notify: NotifyAdapter = (
        RedisNotifyAdapter(url=options.redis_url, prefix=options.redis_prefix)
        if options.redis_url
        else NoopNotifyAdapter()
    )
    client = Client(state=state, notify=notify)
    runner = TaskRunner(backend_alias, client)
    worker = Worker(
        client,
        handlers={type_name(queue): runner.run for queue in queues},
        concurrency=concurrency,
        poll_interval=options.poll_interval if poll_interval is None else poll_interval,
        schedules=schedules,
    )
    runner.worker_id = worker.worker_id
    return worker, engine


async def run_worker(
    worker: Worker,
    engine: AsyncEngine,
    options: BackendOptions,
    *,
    supervised: bool = False,
) -> None:
    """Apply the limits and pauses of ``options``, then run until SIGTERM/SIGINT (a
    graceful drain), then release the engine. ``supervised``: in a worker process of a
    supervisor, which drains when it dies."""
    try:
        async with worker.client:
            await apply_controls(worker.client, options)
            await (run_supervised(worker) if supervised else worker.run())
    finally:
        # An undisposed aiosqlite engine keeps a non-daemon thread, and the process, alive.
        await engine.dispose()


class TaskRunner:
    """The handler of every task queue of one backend."""

    def __init__(self, backend_alias: str, client: Client) -> None:
        self.backend_alias = backend_alias
        self.client = client
        self.worker_id = ""

    async def run(self, job: Job, ctx: JobContext) -> Any:
        payload = job.input
        try:
            task = resolve_task(payload["task"])
        except (ImportError, KeyError, TypeError) as exc:
            # Importing fails the same way on every attempt: fail the job now.
            raise ConfigurationError(f"job {job.id} names no runnable task: {exc}") from None
        progress: dict[str, Any] = started(self.worker_id)
        if job.attempt > 1:
            progress["errors"] = await self._earlier_errors(job)
        await ctx.set_progress(progress)
        result = self._running(job, progress)
        args: list[Any] = list(payload["args"])
        kwargs: dict[str, Any] = dict(payload["kwargs"])
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        last = job.max_attempts is not None and job.attempt >= job.max_attempts
        try:
            if not iscoroutinefunction(task.func):
                return await asyncio.to_thread(_call, task.func, args, kwargs, result, last)
            return await _acall(task.func, args, kwargs, result, last)
        except Exception as exc:
            # Every attempt's error stays with the job (the queue keeps the last only).
            errors = [*progress.get("errors", []), stored_error(job.attempt, task_error(exc))]
            await ctx.set_progress({**progress, "errors": errors})
            raise

    async def _earlier_errors(self, job: Job) -> list[dict[str, Any]]:
        """The errors of the job's earlier attempts, as its last attempt left them; the
        queue's own error for an attempt that ended without the runner (a lease that
        expired, a worker that was killed)."""
        record = await self.client.get_job(job.id)
        progress = record.progress if isinstance(record.progress, dict) else {}
        errors: list[dict[str, Any]] = list(progress.get("errors", []))
        previous = job.attempt - 1
        if record.last_error and all(e.get("attempt") != previous for e in errors):
            errors.append(stored_error(previous, error_of(record.last_error)))
        return errors

    def _running(self, job: Job, progress: dict[str, str]) -> TaskResult:
        """The task's result as it is during this attempt (for ``TaskContext``)."""
        record = JobRecord(
            id=job.id,
            type_name=job.type_name,
            chain_id=job.chain_id,
            chain_index=job.chain_index,
            input=job.input,
            output=None,
            status="running",
            priority=job.priority,
            created_at=job.created_at,
            scheduled_at=job.scheduled_at,
            completed_at=None,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            last_error=None,
            leased_by=self.worker_id,
            lease_token=None,
            leased_until=None,
            deduplication_key=None,
            progress=progress,
        )
        return task_result(record, self.backend_alias)


def _call(
    func: Any, args: list[Any], kwargs: dict[str, Any], result: TaskResult, last: bool
) -> Any:
    """A sync task in a worker thread, between the connection clean-ups Django does
    around a request (the thread's connections are its own)."""
    close_old_connections()
    try:
        task_started.send(QueuertTaskBackend, task_result=result)
        try:
            value = normalize_json(func(*args, **kwargs))
        except Exception as exc:
            if last:
                task_finished.send(QueuertTaskBackend, task_result=_failed(result, exc))
            raise
        task_finished.send(QueuertTaskBackend, task_result=_succeeded(result, value))
        return value
    finally:
        close_old_connections()


async def _acall(
    func: Any, args: list[Any], kwargs: dict[str, Any], result: TaskResult, last: bool
) -> Any:
    """A coroutine task on the worker's loop, between the same connection clean-ups."""
    await sync_to_async(close_old_connections)()
    try:
        await task_started.asend(QueuertTaskBackend, task_result=result)
        try:
            value = normalize_json(await func(*args, **kwargs))
        except Exception as exc:
            if last:
                await task_finished.asend(QueuertTaskBackend, task_result=_failed(result, exc))
            raise
        await task_finished.asend(QueuertTaskBackend, task_result=_succeeded(result, value))
        return value
    finally:
        await sync_to_async(close_old_connections)()


def _succeeded(result: TaskResult, value: Any) -> TaskResult:
    set_field(result, "status", TaskResultStatus.SUCCESSFUL)
    set_field(result, "finished_at", timezone.now())
    set_field(result, "_return_value", value)
    return result


def _failed(result: TaskResult, exc: BaseException) -> TaskResult:
    set_field(result, "status", TaskResultStatus.FAILED)
    set_field(result, "finished_at", timezone.now())
    result.errors.append(task_error(exc))
    return result


def task_error(exc: BaseException) -> TaskError:
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )
