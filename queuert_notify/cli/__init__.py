"""``queuert-notify``: the demo, a worker runner, migrations, chain inspection, and
pausing and limiting job types.

One module per command group -- ``demo``, ``worker``, ``migrate``, ``chains`` (and its
``logs``: ``chain_logs``), ``dashboard``, ``schedules``, ``prune``, ``types`` (pause,
resume, limits), ``health``, ``workers`` -- each listed in :data:`COMMANDS` below and
imported only when its command runs (or shows its own help), so a command starts
without the others' imports; ``options`` holds the options several commands share,
``database`` opens the job database for a command, ``output`` prints. A new command is a
module here and one :data:`COMMANDS` entry. May import the whole package (commands
import what they run on use) and ``state_adapters``."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import NoSuchCommand

from queuert_notify.observe import log_format as logs
from state_adapters import lazy_exports

if TYPE_CHECKING:
    from queuert_notify.cli.database import BadSettingError
    from queuert_notify.cli.options import DATABASE_URL_ENV, DEFAULT_TABLE_PREFIX

COMMANDS = {
    "chains": ("chains", "chains", "Inspect chains, and cancel, retry or delete one."),
    "dashboard": (
        "dashboard",
        "dashboard",
        "Serve the web dashboard (overview, chains, actions, live updates).",
    ),
    "demo": (
        "demo",
        "demo",
        "Run chains with continuations, a blocker and retries through several workers, "
        "then print throughput and wake latency.",
    ),
    "health": (
        "health",
        "health_command",
        "The queue's health: dead rows and vacuum of its tables, transactions holding back "
        "the xmin horizon, the due backlog, leases that ran out; each finding says what it "
        "means and what to do.",
    ),
    "limits": (
        "types",
        "limits",
        "Show the limits of TYPE_NAME, or set them: the options given replace every limit "
        "(one not given is lifted), held across all workers and processes.",
    ),
    "migrate": ("migrate", "migrate", "Create or upgrade the queue's tables (idempotent)."),
    "pause": (
        "types",
        "pause",
        "Stop every worker from claiming jobs of TYPE_NAME (running ones finish).",
    ),
    "prune": (
        "prune",
        "prune_command",
        "Delete finished chains (completed, failed, cancelled) older than --older-than, "
        "with their jobs, in paced batches; chains that unfinished chains wait on are kept.",
    ),
    "resume": (
        "types",
        "resume",
        "Let workers claim TYPE_NAME again (with --redis-url, idle ones wake at once).",
    ),
    "schedules": (
        "schedules",
        "schedules_command",
        "List the schedules of the worker TARGET (module:attr, as for `worker`) with each "
        "one's last tick (from the database) and next tick.",
    ),
    "worker": (
        "worker",
        "worker_command",
        "Run the worker TARGET, given as module:attr -- a Worker, or a function (sync or "
        "async) returning one.",
    ),
    "workers": (
        "workers",
        "workers_command",
        "List the workers (live: a heartbeat within the last 180 s) and the job types with "
        "due jobs that no live worker handles.",
    ),
}
"""Each command: its module in this package, the command's name there, and the first
sentence of its help, which the top-level ``--help`` lists without importing the module
(tests/test_cli_start.py checks that it is the command's own)."""


_as_program = False
"""Whether :data:`main` runs as the program (on ``sys.argv``), which ends with the
command: see :func:`uncollected`."""


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """Run as the program, no garbage collection while the block runs (a command loading
    its libraries), and what it made frozen after: modules, classes and functions that
    live as long as the process, which the collector's passes over the growing heap
    only walked (5 % of `chains list`'s instructions). Called by a test or an
    application, nothing changes."""
    if not (_as_program and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


class _LazyGroup(click.Group):
    """A group whose commands (:data:`COMMANDS`) are imported when one is looked up to
    run, not for the listing of ``--help``."""

    def main(self, args: Sequence[str] | None = None, *rest: Any, **options: Any) -> Any:
        global _as_program
        _as_program = args is None
        try:
            return super().main(args, *rest, **options)
        finally:
            if args is None:
                # Run as the program (on sys.argv, not called by a test): the process
                # ends now, and its objects need no collecting first -- the collector's
                # pass over all of them at exit was 6 % of `chains list`'s instructions.
                gc.freeze()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        from importlib import import_module

        module, name, _ = COMMANDS[cmd_name]
        with uncollected():
            command: click.Command = getattr(import_module(f"{__name__}.{module}"), name)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except NoSuchCommand as error:
            # Click suggests a close name from `self.commands`: none of ours is in it.
            name = error.command_name
            raise NoSuchCommand(name, possibilities=COMMANDS, ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Click's own listing, of stand-ins that carry only each command's help.
        stand_ins = [click.Command(name, help=entry[2]) for name, entry in COMMANDS.items()]
        click.Group(commands=stand_ins).format_commands(ctx, formatter)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="queuert-notify")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """A durable job queue in your own SQL database, woken by notify adapters."""
    logs.configure(logging.INFO if verbose else logging.WARNING)


__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BadSettingError": "queuert_notify.cli.database",
        "DATABASE_URL_ENV": "queuert_notify.cli.options",
        "DEFAULT_TABLE_PREFIX": "queuert_notify.cli.options",
    },
)

__all__ = ["DATABASE_URL_ENV", "DEFAULT_TABLE_PREFIX", "BadSettingError", "main"]
