"""``queuert-notify worker module:attr``: load the user's Worker and run it until a
signal stops it."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from typing import TYPE_CHECKING

import click

from queuert_notify import log_format as logs
from queuert_notify.cli.output import console, run

if TYPE_CHECKING:
    from queuert_notify.worker import Worker


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
def worker_command(target: str, log_format: logs.LogFormat) -> None:
    """Run the worker TARGET, given as module:attr -- a Worker, or a function (sync or
    async) returning one. SIGTERM/SIGINT drain running jobs, a second one cancels them."""
    logs.configure(logging.getLogger().level, log_format)
    run(_run_worker(target))


async def _run_worker(target: str) -> None:
    worker = await load_worker(target)
    engine = getattr(worker.client.state, "engine", None)
    try:
        async with worker.client:
            console().print(
                f"worker [bold]{worker.worker_id}[/] handling {', '.join(worker.type_names)} "
                f"(concurrency {worker.concurrency}, {worker.mode} mode)",
                highlight=False,
            )
            await worker.run()
    finally:
        # The process ends here: release the pool (an undisposed aiosqlite engine keeps
        # a non-daemon thread alive and the process with it).
        if engine is not None:
            await engine.dispose()


async def load_worker(target: str) -> Worker:
    """The Worker ``target`` (``module:attr``) names: the attribute itself, or what
    calling it (and awaiting, if it is async) returns; anything else is a usage error."""
    from queuert_notify.worker import Worker

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
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise click.UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()
        if inspect.isawaitable(obj):
            obj = await obj
    if not isinstance(obj, Worker):
        raise click.UsageError(
            f"{target} is a {type(obj).__name__}; expected a Worker or a function returning one"
        )
    return obj
