"""``queuert-notify schedules TARGET``: a worker's schedules with their last and next tick."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from queuert_notify.cli.options import json_option
from queuert_notify.cli.output import console, run, to_json, when
from queuert_notify.cli.worker import load_worker

if TYPE_CHECKING:
    from queuert_notify.maintenance.schedules import Schedule


@click.command("schedules")
@click.argument("target")
@json_option
def schedules_command(target: str, as_json: bool) -> None:
    """List the schedules of the worker TARGET (module:attr, as for `worker`) with each
    one's last tick (from the database) and next tick."""
    rows = run(_schedule_rows(target))
    if as_json:
        click.echo(to_json({"schedules": rows}))
        return
    table = Table(title="schedules (times in UTC)")
    for column in ("name", "type", "when", "last tick", "next tick"):
        table.add_column(column, no_wrap=column == "name")
    for row in rows:
        upcoming = when(row["next_tick"])
        if row["catch_up"]:
            upcoming += " (due: runs when a worker starts)"
        table.add_row(row["name"], row["type_name"], row["when"], when(row["last_tick"]), upcoming)
    console().print(table)
    if not rows:
        console().print(f"{target} has no schedules", style="dim")


async def _schedule_rows(target: str) -> list[dict[str, Any]]:
    worker = await load_worker(target)
    schedules = worker.settings.schedules
    engine = getattr(worker.client.state, "engine", None)
    try:
        last = await worker.client.state.schedule_ticks([s.name for s in schedules])
    finally:
        # The process ends here: release the pool (see `worker`).
        if engine is not None:
            await engine.dispose()
    now = datetime.now(UTC)
    return [_schedule_row(schedule, last.get(schedule.name), now) for schedule in schedules]


def _schedule_row(schedule: Schedule, last: datetime | None, now: datetime) -> dict[str, Any]:
    """A schedule as the listing shows it. A tick later than the last one recorded is
    due: the next worker to start runs it once (catch-up)."""
    latest = schedule.latest_tick(now)
    catch_up = last is not None and latest > last
    return {
        "name": schedule.name,
        "type_name": schedule.type_name,
        "when": schedule.cadence,
        "last_tick": last,
        "next_tick": latest if catch_up else schedule.next_tick(now),
        "catch_up": catch_up,
    }
