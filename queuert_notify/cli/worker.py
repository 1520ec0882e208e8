"""``queuert-notify worker module:attr``: load the user's Worker and run it until a
signal stops it; with ``--processes N``, N worker processes under a supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

import click

from queuert_notify.cli.output import console, line, run
from queuert_notify.observe import log_format as logs
from queuert_notify.worker.supervisor import (
    EXIT_DO_NOT_RESTART,
    EXIT_JOBS_ABANDONED,
    run_supervised,
)

if TYPE_CHECKING:
    from queuert_notify.worker.worker import Worker


@click.command("worker")
@click.argument("target")
@click.option(
    "--log-format",
    type=click.Choice(logs.LOG_FORMATS),
    default="text",
    show_default=True,
    help="text: rich on a terminal, plain unwrapped lines elsewhere; json: one object "
    "per line with the record's extra keys (job_id, type_name, attempt, worker_id).",
)
@click.option(
    "--processes",
    type=click.IntRange(1),
    default=None,
    help="Worker processes to run under one supervisor that restarts a crashed one "
    "[default: one per core]. 1 runs the worker in this process, unsupervised.",
)
@click.option(
    "--startup-timeout",
    type=click.FloatRange(0),
    default=None,
    help="Seconds to wait at start for a database that does not answer (one line per "
    "try), then exit non-zero with one line [default: the Worker's startup_timeout, 30]. "
    "Tables never migrated, wrong credentials or no such database fail at once.",
)
@click.option("--supervised", is_flag=True, hidden=True)
@click.pass_context
def worker_command(
    context: click.Context,
    target: str,
    log_format: logs.LogFormat,
    processes: int | None,
    startup_timeout: float | None,
    supervised: bool,
) -> None:
    """Run the worker TARGET, given as module:attr -- a Worker, or a function (sync or
    async) returning one. SIGTERM/SIGINT drain running jobs, a second one cancels them.
    With several --processes, each child process builds its own worker from TARGET."""
    logs.configure(logging.getLogger().level, log_format)
    processes = processes or os.cpu_count() or 1
    if processes > 1 and not supervised:
        sys.exit(_supervise(context, target, log_format, processes, startup_timeout))
    try:
        run(_run_worker(target, startup_timeout, supervised=supervised))
    except click.ClickException as exc:
        if not supervised or isinstance(exc, click.UsageError | _JobsAbandonedError):
            raise
        # The supervisor must not restart a worker into the same one-line error.
        raise _DoNotRestartError(exc.message) from None


class _DoNotRestartError(click.ClickException):
    exit_code = EXIT_DO_NOT_RESTART


class _JobsAbandonedError(click.ClickException):
    exit_code = EXIT_JOBS_ABANDONED


def _supervise(
    context: click.Context,
    target: str,
    log_format: logs.LogFormat,
    processes: int,
    startup_timeout: float | None,
) -> int:
    from queuert_notify.worker.supervisor import Supervisor
    from queuert_notify.worker.worker import Worker

    # A bad target is a usage error here, not in every child.
    obj = _import_target(target)
    if not isinstance(obj, Worker) and not callable(obj):
        _not_a_worker(target, obj)
    verbose = context.parent is not None and context.parent.params.get("verbose", False)
    command = [
        sys.executable,
        "-m",
        "queuert_notify.cli",
        *(["-v"] if verbose else []),
        "worker",
        target,
        f"--log-format={log_format}",
        "--processes=1",
        *([] if startup_timeout is None else [f"--startup-timeout={startup_timeout}"]),
        "--supervised",
    ]
    console().print(f"supervising {processes} worker processes of {target}", highlight=False)
    return asyncio.run(Supervisor(command, processes).run())


async def _run_worker(target: str, startup_timeout: float | None, *, supervised: bool) -> None:
    worker = await load_worker(target)
    if startup_timeout is not None:
        worker.settings = dataclasses.replace(worker.settings, startup_timeout=startup_timeout)
    engine = getattr(worker.client.state, "engine", None)
    try:
        async with worker.client:
            console().print(
                line(
                    "worker ",
                    (worker.worker_id, "bold"),
                    f" handling {', '.join(worker.type_names)} "
                    f"(concurrency {worker.concurrency}, {worker.mode} mode)",
                )
            )
            if supervised:
                await run_supervised(worker)
            else:
                await worker.run()
    finally:
        # The process ends here: release the pool (an undisposed aiosqlite engine keeps
        # a non-daemon thread alive and the process with it).
        if engine is not None:
            await engine.dispose()
    if worker.abandoned_jobs:
        raise _JobsAbandonedError(
            f"stopped with {worker.abandoned_jobs} running jobs unfinished; they run again "
            "once their leases expire"
        )


async def load_worker(target: str) -> Worker:
    """The Worker ``target`` (``module:attr``) names: the attribute itself, or what
    calling it (and awaiting, if it is async) returns; anything else is a usage error."""
    from queuert_notify.worker.worker import Worker

    obj = _import_target(target)
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()
        if inspect.isawaitable(obj):
            obj = await obj
    if not isinstance(obj, Worker):
        _not_a_worker(target, obj)
    return obj


def _not_a_worker(target: str, obj: object) -> NoReturn:
    raise click.UsageError(
        f"{target} is a {type(obj).__name__}; expected a Worker or a function returning one"
    )


def _import_target(target: str) -> object:
    """The object ``module:attr`` names (not called yet)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise click.UsageError(f"expected module:attr, got {target!r}")
    # Like `python -m`: modules in the current directory are importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.UsageError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:
        # The user's module raised while it was imported (a missing setting, a bug): one
        # line naming the error and where it was raised, in every process alike.
        raise click.ClickException(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}{_raised_at(exc)}"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise click.UsageError(f"module {module_name!r} has no attribute {attr!r}") from None


def _raised_at(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame ``exc`` was raised in."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
