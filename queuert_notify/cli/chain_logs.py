"""``queuert-notify chains logs CHAIN_ID``: the lines a chain's jobs logged, attempt by
attempt, and with ``--follow`` the new ones as they are written, until the chain ends."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import click

from queuert_notify.cli.database import with_state
from queuert_notify.cli.options import database_url_option, json_option, table_prefix_option
from queuert_notify.cli.output import json_value, run
from state_adapters.model import FINAL_STATUSES, JobLogLine, LogPosition

if TYPE_CHECKING:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

FOLLOW_INTERVAL = 0.5
"""Seconds between two reads of ``--follow``: lines are written at most a second apart."""


@click.command("logs")
@database_url_option
@table_prefix_option
@click.argument("chain_id")
@click.option(
    "--follow", "-f", is_flag=True, help="Print new lines as they come, until the chain ends."
)
@json_option
def chains_logs(
    database_url: str, table_prefix: str, chain_id: str, follow: bool, as_json: bool
) -> None:
    """Print the lines a chain's jobs logged (ctx.log, JobLogHandler), job by job, attempt
    by attempt; --json prints one JSON object a line."""

    def show(index: int, line: JobLogLine) -> None:
        if as_json:
            click.echo(json.dumps(_as_dict(index, line), default=json_value))
            return
        extra = " ".join(
            f"{k}={json.dumps(v, default=str)}" for k, v in (line.fields or {}).items()
        )
        click.echo(
            f"{line.at.strftime('%H:%M:%S.%f')[:-3]} job {index} attempt {line.attempt} "
            f"{line.level:<7} {line.message}" + (f"  {extra}" if extra else "")
        )

    async def go(state: SqlAlchemyStateAdapter) -> None:
        await print_chain_logs(state, chain_id, show, follow=follow)

    run(with_state(database_url, table_prefix, go))


async def print_chain_logs(
    state: SqlAlchemyStateAdapter,
    chain_id: str,
    show: Any,
    *,
    follow: bool,
    interval: float = FOLLOW_INTERVAL,
) -> None:
    """``show(chain_index, line)`` for every line of the chain's jobs, each once; with
    ``follow``, again after every ``interval`` until the chain is final (then a last read:
    lines written with the last completion are printed too)."""
    shown: dict[str, LogPosition | None] = {}
    while True:
        chain = await state.get_chain(chain_id)  # ChainNotFoundError: one line
        final = chain.status in FINAL_STATUSES
        jobs = sorted(
            (await state.list_jobs(chain_id=chain_id, limit=1000)).items,
            key=lambda job: job.chain_index,
        )
        for job in jobs:
            for line in await state.job_logs(job.id, after=shown.get(job.id)):
                show(job.chain_index, line)
                shown[job.id] = (line.attempt, line.seq)
        if final or not follow:
            return
        await asyncio.sleep(interval)


def _as_dict(index: int, line: JobLogLine) -> dict[str, Any]:
    return {
        "chain_index": index,
        "job_id": line.job_id,
        "attempt": line.attempt,
        "seq": line.seq,
        "at": line.at,
        "level": line.level,
        "message": line.message,
        "fields": line.fields,
    }
