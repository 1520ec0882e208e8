"""``queuert-notify health [--json] [--check]``: the queue's health report (see
:meth:`queuert_notify.Client.health`), for a person or for cron and monitoring."""

from __future__ import annotations

import dataclasses
import sys

import click
from rich.table import Table
from rich.text import Text

from queuert_notify.cli.database import with_client
from queuert_notify.cli.options import database_url_option, json_option, table_prefix_option
from queuert_notify.cli.output import console, run, to_json, when
from state_adapters.health import (
    DEFAULT_HORIZON_AGE,
    HealthReport,
    HealthThresholds,
    Severity,
    duration,
    size,
)

EXIT_CODES: dict[Severity, int] = {"ok": 0, "warning": 1, "critical": 2}
"""``--check``: the exit status for the report's worst finding."""
_STYLES: dict[Severity, str] = {"ok": "green", "warning": "yellow", "critical": "bold red"}


@click.command("health")
@database_url_option
@table_prefix_option
@json_option
@click.option(
    "--check",
    is_flag=True,
    help="Exit 0 when every finding is ok, 1 on a warning, 2 on a critical finding.",
)
@click.option(
    "--horizon-age",
    default=DEFAULT_HORIZON_AGE,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds from which a transaction holding back vacuum is a finding.",
)
def health_command(
    database_url: str, table_prefix: str, as_json: bool, check: bool, horizon_age: float
) -> None:
    """The queue's health: dead rows and vacuum of its tables, transactions holding back
    the xmin horizon, the due backlog, leases that ran out; each finding says what it
    means and what to do."""
    thresholds = HealthThresholds(horizon_age=horizon_age)
    no_notify = (None, "queuert")
    report = run(
        with_client(
            database_url,
            table_prefix,
            no_notify,
            lambda client: client.health(thresholds=thresholds),
        )
    )
    if as_json:
        click.echo(to_json({**dataclasses.asdict(report), "severity": report.severity}))
    else:
        _print(report)
    if check:
        sys.exit(EXIT_CODES[report.severity])


def _print(report: HealthReport) -> None:
    out = console()
    style = _STYLES[report.severity]
    # Text objects: a backend's query or a slot's name is data, never rich markup.
    out.print(
        Text.assemble(
            (report.severity.upper(), style),
            f" {report.database} at {when(report.checked_at)} UTC",
        )
    )
    for finding in report.findings:
        out.print(
            Text.assemble(
                (f"{finding.severity:<8}", _STYLES[finding.severity]),
                f" {finding.subject}: {finding.summary}",
            )
        )
        if finding.severity != "ok":
            out.print(Text(f"         means: {finding.meaning}"))
            out.print(Text(f"         do: {finding.action}"))
    if report.tables:
        table = Table("table", "live", "dead", "dead %", "size", "indexes", "vacuumed", "analyzed")
        for t in report.tables:
            table.add_row(
                t.name,
                str(t.live_rows),
                str(t.dead_rows),
                f"{t.dead_ratio:.0%}",
                size(t.table_bytes),
                size(t.index_bytes),
                when(t.vacuumed_at),
                when(t.analyzed_at),
            )
        out.print(table)
    for holder in report.horizon:
        age = "" if holder.age_seconds is None else f", {duration(holder.age_seconds)}"
        out.print(Text(f"holding the horizon: {holder.kind} {holder.name}{age}"))
    for vacuum in report.vacuums:
        out.print(Text(f"vacuum running: {vacuum.table} ({vacuum.phase})"))
