"""``queuert-notify``: the demo, a worker runner, migrations, chain inspection, and
pausing and limiting job types.

One module per command group -- ``demo``, ``worker``, ``migrate``, ``chains`` (and its
``logs``: ``chain_logs``), ``dashboard``, ``schedules``, ``prune``, ``types`` (pause,
resume, limits), ``health``, ``workers`` -- each
registered on :func:`main` below; ``options`` holds the options several commands share,
``database`` opens the job database for a command, ``output`` prints. A new command is a
module here and one ``main.add_command`` line. May import the whole package (commands
import what they run on use) and ``state_adapters``."""

from __future__ import annotations

import logging

import click

from queuert_notify.cli import (
    chain_logs,
    chains,
    dashboard,
    demo,
    health,
    migrate,
    prune,
    schedules,
    types,
    worker,
    workers,
)
from queuert_notify.cli.database import BadSettingError
from queuert_notify.cli.options import DATABASE_URL_ENV, DEFAULT_TABLE_PREFIX
from queuert_notify.observe import log_format as logs

__all__ = ["DATABASE_URL_ENV", "DEFAULT_TABLE_PREFIX", "BadSettingError", "main"]


@click.group()
@click.version_option(package_name="queuert-notify")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """A durable job queue in your own SQL database, woken by notify adapters."""
    logs.configure(logging.INFO if verbose else logging.WARNING)


main.add_command(demo.demo)
main.add_command(worker.worker_command)
main.add_command(migrate.migrate)
main.add_command(chains.chains)
chains.chains.add_command(chain_logs.chains_logs)
main.add_command(dashboard.dashboard)
main.add_command(schedules.schedules_command)
main.add_command(prune.prune_command)
main.add_command(types.pause)
main.add_command(types.resume)
main.add_command(types.limits)
main.add_command(health.health_command)
main.add_command(workers.workers_command)
