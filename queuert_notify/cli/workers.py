"""``queuert-notify workers``: the workers recorded in the database, live or dead, and
the job types with due jobs that no live worker handles."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from queuert_notify.cli.database import with_state
from queuert_notify.cli.options import database_url_option, json_option, table_prefix_option
from queuert_notify.cli.output import console, run, titled_table, to_json, when
from state_adapters.model import WORKER_DEAD_AFTER, known_types, unhandled_line, unhandled_types

if TYPE_CHECKING:
    from state_adapters.model import WorkerRecord
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

Unhandled = tuple[dict[str, int], list[str]]
"""Due jobs per type no live worker handles, and the types live workers handle."""


async def unhandled(state: SqlAlchemyStateAdapter) -> Unhandled:
    """What :data:`Unhandled` says, read now (two reads)."""
    workers, now = await state.workers(), datetime.now(UTC)
    return unhandled_types(await state.due_jobs_by_type(), workers, now), known_types(workers, now)


@click.command("workers")
@database_url_option
@table_prefix_option
@json_option
def workers_command(database_url: str, table_prefix: str, as_json: bool) -> None:
    """List the workers (live: a heartbeat within the last 180 s) and the job types
    with due jobs that no live worker handles."""

    async def go(state: SqlAlchemyStateAdapter) -> tuple[list[WorkerRecord], Unhandled]:
        return await state.workers(), await unhandled(state)

    workers, (orphans, known) = run(with_state(database_url, table_prefix, go))
    now = datetime.now(UTC)
    if as_json:
        rows: list[dict[str, Any]] = [
            {**dataclasses.asdict(worker), "alive": worker.alive(now)} for worker in workers
        ]
        click.echo(to_json({"workers": rows, "unhandled_types": orphans}))
        return
    table = titled_table(f"workers (dead after {WORKER_DEAD_AFTER:.0f} s without a heartbeat)")
    table.add_column("id", no_wrap=True)
    for column in ("host", "pid", "types", "slots", "started", "heartbeat", "state"):
        table.add_column(column)
    for worker in workers:
        table.add_row(
            worker.id,
            worker.host,
            str(worker.pid),
            ", ".join(worker.type_names),
            str(worker.slots),
            when(worker.started_at),
            when(worker.heartbeat_at),
            "live" if worker.alive(now) else "dead",
        )
    console().print(table)
    for orphan, count in orphans.items():
        console().print(unhandled_line(orphan, count, known), highlight=False)
