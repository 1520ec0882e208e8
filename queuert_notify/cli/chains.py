"""``queuert-notify chains ...``: list and show chains; cancel, retry or delete one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import click

from queuert_notify.cli.chain_logs import chains_logs
from queuert_notify.cli.database import with_client, with_state
from queuert_notify.cli.options import (
    database_url_option,
    json_option,
    note_next_poll,
    redis_url_option,
    table_prefix_option,
)
from queuert_notify.cli.output import (
    console,
    line,
    record,
    run,
    short,
    titled_table,
    to_json,
    when,
)
from queuert_notify.cli.types import describe
from queuert_notify.cli.workers import Unhandled, unhandled
from state_adapters.model import ALL_STATUSES, unhandled_line

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from queuert_notify.client.client import Client
    from state_adapters.model import JobStatus
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


@click.group()
def chains() -> None:
    """Inspect chains, and cancel, retry or delete one."""


chains.add_command(chains_logs)


@chains.command("list")
@database_url_option
@table_prefix_option
@click.option("--status", type=click.Choice(ALL_STATUSES), default=None)
@click.option("--type", "type_name", default=None, help="Type name of the chain's first job.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--after",
    metavar="CURSOR",
    default=None,
    help="Start after this chain: the cursor the previous page printed (next_cursor).",
)
@json_option
def chains_list(
    database_url: str,
    table_prefix: str,
    status: str | None,
    type_name: str | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """List chains, newest first; flags job types with due jobs and no live worker."""

    async def go(state: SqlAlchemyStateAdapter) -> tuple[Any, list[Any], Unhandled]:
        page = await state.list_chains(
            status=cast("JobStatus | None", status),  # click.Choice(ALL_STATUSES)
            type_name=type_name,
            limit=limit,
            after=after,
        )
        return page, await state.type_controls(), await unhandled(state)

    page, controls, (orphans, known) = run(with_state(database_url, table_prefix, go))
    paused = sorted(c.type_name for c in controls if c.paused)
    if as_json:
        rows = [record(chain) for chain in page.items]
        listing = {"chains": rows, "next_cursor": page.next_cursor, "paused_types": paused}
        click.echo(to_json({**listing, "unhandled_types": orphans}))
        return
    table = titled_table("chains")
    # Ids are what users copy into `chains show`: never wrap or cut them.
    table.add_column("id", no_wrap=True, min_width=max((len(c.id) for c in page.items), default=2))
    for column in ("type", "status", "created", "completed", "output"):
        table.add_column(column)
    for chain in page.items:
        table.add_row(
            chain.id,
            chain.type_name,
            chain.status,
            when(chain.created_at),
            when(chain.completed_at),
            short(chain.output),
        )
    console().print(table)
    if page.next_cursor:
        console().print(f"more: --after {page.next_cursor}", style="dim", highlight=False)
    # What holds chains back that no row above shows.
    for control in controls:
        console().print(describe(control), highlight=False)
    for orphan, count in orphans.items():
        console().print(unhandled_line(orphan, count, known), highlight=False)


@chains.command("show")
@database_url_option
@table_prefix_option
@click.argument("chain_id")
@json_option
def chains_show(database_url: str, table_prefix: str, chain_id: str, as_json: bool) -> None:
    """Show one chain and every job in it."""

    async def go(state: SqlAlchemyStateAdapter) -> tuple[Any, Any]:
        chain = await state.get_chain(chain_id)
        jobs = await state.list_jobs(chain_id=chain_id, limit=1000)
        return chain, jobs

    chain, jobs = run(with_state(database_url, table_prefix, go))
    if as_json:
        ordered = sorted(jobs.items, key=lambda j: j.chain_index)
        click.echo(to_json({"chain": record(chain), "jobs": [record(j) for j in ordered]}))
        return
    console().print(
        line(
            "chain ",
            (chain.id, "bold"),
            f" ({chain.type_name}): ",
            (chain.status, "bold"),
            f", created {when(chain.created_at)}, completed {when(chain.completed_at)}",
        )
    )
    console().print(f"output: {short(chain.output, 500)}", highlight=False)
    table = titled_table("jobs")
    table.add_column("#")
    table.add_column("id", no_wrap=True, min_width=max((len(j.id) for j in jobs.items), default=2))
    for column in ("type", "status", "attempt", "scheduled", "input", "error"):
        table.add_column(column)
    for job in sorted(jobs.items, key=lambda j: j.chain_index):
        attempts = f"{job.attempt}/{job.max_attempts or '∞'}"
        # A completed job's last_error is an earlier attempt's: not an error any more.
        error = "" if job.status == "completed" else (job.last_error or "")
        error_lines = error.strip().splitlines()
        table.add_row(
            str(job.chain_index),
            job.id,
            job.type_name,
            job.status,
            attempts,
            when(job.scheduled_at),
            short(job.input),
            error_lines[-1] if error_lines else "",
        )
    console().print(table)


def _chain_action(name: str, act: Callable[[Client, str], Awaitable[Any]], help: str) -> None:
    """``chains NAME CHAIN_ID``: ``act(client, chain_id)``, then the chain as it stands."""

    @chains.command(name, help=help)
    @database_url_option
    @table_prefix_option
    @redis_url_option
    @click.argument("chain_id")
    @json_option
    def command(
        database_url: str,
        table_prefix: str,
        redis_url: str | None,
        redis_prefix: str,
        chain_id: str,
        as_json: bool,
    ) -> None:
        notify = (redis_url, redis_prefix)
        chain = run(with_client(database_url, table_prefix, notify, lambda c: act(c, chain_id)))
        _print_chain(chain, as_json)
        note_next_poll(redis_url)


_chain_action(
    "cancel",
    lambda client, chain_id: client.cancel_chain(chain_id),
    "Cancel a chain's unfinished job (a handler running it is cancelled).",
)
_chain_action(
    "retry",
    lambda client, chain_id: client.retry_chain(chain_id),
    "Run a failed or cancelled chain again from its last job.",
)


@chains.command("delete")
@database_url_option
@table_prefix_option
@click.argument("chain_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def chains_delete(database_url: str, table_prefix: str, chain_id: str, yes: bool) -> None:
    """Delete a chain and its jobs (refused while other chains wait on it)."""
    if not yes:
        click.confirm(f"Delete chain {chain_id} and its jobs?", abort=True)
    no_notify = (None, "queuert")
    run(with_client(database_url, table_prefix, no_notify, lambda c: c.delete_chain(chain_id)))
    click.echo(f"deleted chain {chain_id}")


def _print_chain(chain: Any, as_json: bool) -> None:
    if as_json:
        click.echo(to_json({"chain": record(chain)}))
        return
    console().print(
        line("chain ", (chain.id, "bold"), f" ({chain.type_name}): ", (chain.status, "bold"))
    )
