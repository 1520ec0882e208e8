"""``queuert-notify``: the demo, a worker runner, migrations and chain inspection."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from queuert_notify import log_format as logs
from queuert_notify.errors import ConfigurationError, QueuertError, mask_url
from state_adapters.protocol import ALL_STATUSES

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from queuert_notify.client import Client
    from queuert_notify.demo import DemoReport
    from queuert_notify.worker import Worker
    from state_adapters.protocol import JobStatus
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

T = TypeVar("T")

DATABASE_URL_ENV = "QUEUERT_DATABASE_URL"
DEFAULT_TABLE_PREFIX = "queuert_"
_UNFOLDED_WIDTH = 10_000

database_url_option = click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    required=True,
    help=f"SQLAlchemy URL of the job database (or ${DATABASE_URL_ENV}), e.g. "
    "postgresql+psycopg://user@host/db or sqlite+aiosqlite:///jobs.db",
)
table_prefix_option = click.option(
    "--table-prefix",
    default=DEFAULT_TABLE_PREFIX,
    show_default=True,
    help="Prefix of the queue's tables.",
)


@click.group()
@click.version_option(package_name="queuert-notify")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """A durable job queue in your own SQL database, woken by notify adapters."""
    logs.configure(logging.INFO if verbose else logging.WARNING)


@main.command()
@click.option(
    "--database-url",
    default=None,
    help="Run on this database instead of a fresh SQLite file (tables get a unique "
    "prefix and are dropped afterwards).",
)
@click.option("--redis-url", default=None, help="Use Redis notify instead of in-process.")
@click.option("--chains", default=3000, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default=10, show_default=True, type=click.IntRange(1))
@click.option(
    "--mode", type=click.Choice(["atomic", "staged"]), default="atomic", show_default=True
)
def demo(
    database_url: str | None,
    redis_url: str | None,
    chains: int,
    workers: int,
    concurrency: int,
    mode: str,
) -> None:
    """Run chains with continuations, a blocker and retries through several workers,
    then print throughput and wake latency. Needs no server by default."""
    from queuert_notify.demo import engine_options, run_demo

    engine = _engine(database_url, **engine_options(workers)) if database_url else None
    where = mask_url(database_url) if database_url else "a fresh SQLite file"
    via = mask_url(redis_url) if redis_url else "in-process notify"
    _console().print(
        f"[bold]queuert-notify demo[/]: {chains} chains x 3 jobs, {workers} workers x "
        f"{concurrency} slots ({mode} mode), on {where} with {via}"
    )

    async def go() -> DemoReport:
        try:
            if engine is not None and database_url:
                await _check_reachable(engine, database_url)
            with Progress(
                TextColumn("chains"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=_console(),
            ) as bar:
                task = bar.add_task("chains", total=chains + 2)
                return await run_demo(
                    engine=engine,
                    redis_url=redis_url,
                    chains=chains,
                    workers=workers,
                    concurrency=concurrency,
                    mode="staged" if mode == "staged" else "atomic",
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
        finally:
            if engine is not None:
                await engine.dispose()

    _console().print(_summary_table(_run(go())))


def _summary_table(report: DemoReport) -> Table:
    from queuert_notify.demo import latency_summary

    table = Table(title="demo summary", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("database", report.database)
    table.add_row("notify adapter", report.notify)
    table.add_row("workers x concurrency", f"{report.workers} x {report.concurrency}")
    table.add_row("mode", report.mode)
    table.add_row("chains finished", str(report.chains))
    table.add_row("jobs run", str(report.jobs))
    table.add_row("elapsed", f"{report.seconds:.2f} s")
    table.add_row("throughput", f"{report.jobs_per_second:,.0f} jobs/s")
    table.add_row(
        "wake latency p50 / p90 / p99",
        f"{latency_summary(report)} ms  ({len(report.wake_latencies_ms)} idle probes, "
        "commit -> handler start)",
    )
    table.add_row("retries", str(report.retries))
    table.add_row("failed chains", f"{report.failures} (1 fails on purpose)")
    table.add_row(
        "final job statuses",
        ", ".join(f"{k}: {v}" for k, v in sorted(report.final_statuses.items())),
    )
    return table


@main.command("worker")
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
    _run(_run_worker(target))


async def _run_worker(target: str) -> None:
    worker = await _load_worker(target)
    engine = getattr(worker.client.state, "engine", None)
    try:
        async with worker.client:
            _console().print(
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


async def _load_worker(target: str) -> Worker:
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


@main.command()
@database_url_option
@table_prefix_option
@click.option(
    "--adopt",
    is_flag=True,
    help="Take over queue tables your application's own Alembic created: check that "
    "they match this version's schema, then record that version (changes no table).",
)
def migrate(database_url: str, table_prefix: str, adopt: bool) -> None:
    """Create or upgrade the queue's tables (idempotent)."""

    async def go(state: SqlAlchemyStateAdapter) -> None:
        await state.migrate(adopt=adopt)

    _run(_with_state(database_url, table_prefix, go))
    _console().print(f"migrated {mask_url(database_url)} (table prefix {table_prefix!r})")


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON (every field, untruncated; times in ISO 8601 UTC) instead of tables.",
)


@main.group()
def chains() -> None:
    """Inspect chains, and cancel, retry or delete one."""


@chains.command("list")
@database_url_option
@table_prefix_option
@click.option("--status", type=click.Choice(ALL_STATUSES), default=None)
@click.option("--type", "type_name", default=None, help="Type name of the chain's first job.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@json_option
def chains_list(
    database_url: str,
    table_prefix: str,
    status: str | None,
    type_name: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List chains, newest first."""

    async def go(state: SqlAlchemyStateAdapter) -> Any:
        return await state.list_chains(
            status=cast("JobStatus | None", status),  # click.Choice(ALL_STATUSES)
            type_name=type_name,
            limit=limit,
        )

    page = _run(_with_state(database_url, table_prefix, go))
    if as_json:
        chains = [_record(chain) for chain in page.items]
        click.echo(_json({"chains": chains, "next_cursor": page.next_cursor}))
        return
    table = Table(title="chains")
    # Ids are what users copy into `chains show`: never wrap or cut them.
    table.add_column("id", no_wrap=True, min_width=max((len(c.id) for c in page.items), default=2))
    for column in ("type", "status", "created", "completed", "output"):
        table.add_column(column)
    for chain in page.items:
        table.add_row(
            chain.id,
            chain.type_name,
            chain.status,
            _when(chain.created_at),
            _when(chain.completed_at),
            _short(chain.output),
        )
    _console().print(table)
    if page.next_cursor:
        _console().print(f"more: --limit {limit * 2} shows the next ones", style="dim")


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

    chain, jobs = _run(_with_state(database_url, table_prefix, go))
    if as_json:
        ordered = sorted(jobs.items, key=lambda j: j.chain_index)
        click.echo(_json({"chain": _record(chain), "jobs": [_record(j) for j in ordered]}))
        return
    _console().print(
        f"chain [bold]{chain.id}[/] ({chain.type_name}): [bold]{chain.status}[/], "
        f"created {_when(chain.created_at)}, completed {_when(chain.completed_at)}",
        highlight=False,
    )
    _console().print(f"output: {_short(chain.output, 500)}", highlight=False)
    table = Table(title="jobs")
    table.add_column("#")
    table.add_column("id", no_wrap=True, min_width=max((len(j.id) for j in jobs.items), default=2))
    for column in ("type", "status", "attempt", "scheduled", "input", "error"):
        table.add_column(column)
    for job in sorted(jobs.items, key=lambda j: j.chain_index):
        attempts = f"{job.attempt}/{job.max_attempts or '∞'}"
        error = (job.last_error or "").strip().splitlines()
        table.add_row(
            str(job.chain_index),
            job.id,
            job.type_name,
            job.status,
            attempts,
            _when(job.scheduled_at),
            _short(job.input),
            error[-1] if error else "",
        )
    _console().print(table)


def redis_url_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--redis-url`` and ``--redis-prefix``: where to announce a change."""
    command = click.option(
        "--redis-prefix", default="queuert", show_default=True, help="The workers' Redis prefix."
    )(command)
    return click.option(
        "--redis-url",
        default=None,
        help="Redis to announce the change on (workers wake at once); without it they find "
        "it at their next poll.",
    )(command)


@chains.command("cancel")
@database_url_option
@table_prefix_option
@redis_url_option
@click.argument("chain_id")
@json_option
def chains_cancel(
    database_url: str,
    table_prefix: str,
    redis_url: str | None,
    redis_prefix: str,
    chain_id: str,
    as_json: bool,
) -> None:
    """Cancel a chain's unfinished job (a handler running it is cancelled)."""
    notify = (redis_url, redis_prefix)
    chain = _run(_with_client(database_url, table_prefix, notify, lambda c: c.cancel(chain_id)))
    _print_chain(chain, as_json)


@chains.command("retry")
@database_url_option
@table_prefix_option
@redis_url_option
@click.argument("chain_id")
@json_option
def chains_retry(
    database_url: str,
    table_prefix: str,
    redis_url: str | None,
    redis_prefix: str,
    chain_id: str,
    as_json: bool,
) -> None:
    """Run a failed or cancelled chain again from its last job."""
    notify = (redis_url, redis_prefix)
    chain = _run(
        _with_client(database_url, table_prefix, notify, lambda c: c.retry_chain(chain_id))
    )
    _print_chain(chain, as_json)


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
    _run(_with_client(database_url, table_prefix, no_notify, lambda c: c.delete_chain(chain_id)))
    click.echo(f"deleted chain {chain_id}")


def _print_chain(chain: Any, as_json: bool) -> None:
    if as_json:
        click.echo(_json({"chain": _record(chain)}))
        return
    _console().print(f"chain [bold]{chain.id}[/] ({chain.type_name}): [bold]{chain.status}[/]")


async def _with_client(
    database_url: str,
    table_prefix: str,
    redis: tuple[str | None, str],
    action: Callable[[Client], Awaitable[T]],
) -> T:
    """``action`` on a client of the database and, given a ``(url, prefix)`` of Redis,
    announcing the change there."""
    from queuert_notify.client import Client
    from queuert_notify.notify.noop import NoopNotifyAdapter
    from queuert_notify.notify.redis import RedisNotifyAdapter

    async def act(state: SqlAlchemyStateAdapter) -> T:
        url, prefix = redis
        notify = NoopNotifyAdapter() if url is None else RedisNotifyAdapter(url, prefix=prefix)
        async with Client(state=state, notify=notify) as client:
            return await action(client)

    return await _with_state(database_url, table_prefix, act)


async def _with_state(
    database_url: str,
    table_prefix: str,
    action: Callable[[SqlAlchemyStateAdapter], Awaitable[T]],
) -> T:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    engine = _engine(database_url)
    try:
        await _check_reachable(engine, database_url)
        return await action(SqlAlchemyStateAdapter(engine, table_prefix=table_prefix))
    finally:
        await engine.dispose()


class BadSettingError(click.ClickException):
    """A setting no command can run with (a database URL no supported async driver
    serves): one line naming the library's error, exit code 2 like click's own usage
    errors, before anything connects."""

    exit_code = 2

    def __init__(self, error: ConfigurationError) -> None:
        super().__init__(f"{type(error).__name__}: {error}")


def _engine(database_url: str, **options: Any) -> AsyncEngine:
    """An engine for ``database_url`` (``options`` go to ``create_async_engine``); a URL
    that names no supported, installed async driver, or an in-memory SQLite database
    (private to one connection, so empty for every other), is a
    :class:`BadSettingError` shown without the URL's password, not a traceback."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, InvalidRequestError
    from sqlalchemy.ext.asyncio import create_async_engine

    from state_adapters.database import check_supported

    def unsupported(reason: str) -> BadSettingError:
        return BadSettingError(
            ConfigurationError(
                f"unsupported database URL {mask_url(database_url)!r} ({reason}); use "
                "postgresql+psycopg://user@host/db or sqlite+aiosqlite:///jobs.db"
            )
        )

    try:
        url = make_url(_async_url(database_url))
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise unsupported("an in-memory SQLite database is private to one connection")
        engine = create_async_engine(url, **options)
    except (ArgumentError, InvalidRequestError, ImportError) as exc:
        # ArgumentError: unparseable or unknown dialect; InvalidRequestError: a sync
        # driver; ImportError: a driver that is not installed.
        raise unsupported(str(exc).splitlines()[0]) from None
    try:
        check_supported(engine)
    except ConfigurationError as exc:
        raise BadSettingError(exc) from None
    return engine


async def _check_reachable(engine: AsyncEngine, database_url: str) -> None:
    """Connect once now, so that a database that does not answer is a one-line
    ``ConfigurationError`` naming the address (password masked), not a traceback from
    the first query."""
    from sqlalchemy.exc import DBAPIError

    try:
        if engine.dialect.name == "sqlite":
            # Opened as aiosqlite would, but not through it: after a failed open its
            # worker thread outlives the CLI's event loop and prints a traceback.
            await asyncio.to_thread(_open_sqlite, str(engine.url.database))
        else:
            async with engine.connect():
                pass
    except (DBAPIError, OSError, sqlite3.Error) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        password = engine.url.password
        if password:
            reason = reason.replace(str(password), "***")
        hint = (
            "does its directory exist, and may this user write there?"
            if engine.dialect.name == "sqlite"
            else "is the server running, and are the address and credentials right?"
        )
        raise ConfigurationError(
            f"cannot connect to the database at {mask_url(database_url)}: {reason}; {hint}"
        ) from None


def _open_sqlite(path: str) -> None:
    sqlite3.connect(path).close()


def _async_url(url: str) -> str:
    """Pick the async driver the project ships when the URL names none."""
    for plain, with_driver in (
        ("postgres://", "postgresql+psycopg://"),
        ("postgresql://", "postgresql+psycopg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(plain):
            return with_driver + url[len(plain) :]
    return url


def _run(coro: Awaitable[T]) -> T:
    """Run ``coro``; turn the library's typed errors into a one-line CLI error."""

    async def main() -> T:
        return await coro

    try:
        return asyncio.run(main())
    except QueuertError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def _console() -> Console:
    # Created per use, so the terminal width (or $COLUMNS) is read when printing.
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Into a file or a pipe: lines as long as they need, not folded at 80 columns.
        return Console(width=_UNFOLDED_WIDTH)
    return console


def _record(record: Any) -> dict[str, Any]:
    """A chain or job record as a dict, without lease tokens (they fence a worker's
    writes; nobody reading a listing needs them)."""
    data: dict[str, Any] = dataclasses.asdict(record)
    for item in (data, data.get("last_job") or {}):
        item.pop("lease_token", None)
    return data


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=_json_value)


def _json_value(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _when(moment: Any) -> str:
    """UTC, to the second, without the offset (every stored time is UTC)."""
    if moment is None:
        return "-"
    return str(moment.strftime("%Y-%m-%d %H:%M:%S"))


def _short(value: Any, limit: int = 60) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


if __name__ == "__main__":
    main()
