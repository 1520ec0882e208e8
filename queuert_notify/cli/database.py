"""Opening the job database for a command: an engine from a URL (a bad URL is one line,
not a traceback), a reachability check, and a state adapter or client around it that is
disposed when the command ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from queuert_notify.errors import ConfigurationError, mask_url
from state_adapters.errors import cannot_connect, cannot_connect_reason

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from queuert_notify.client.client import Client
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

T = TypeVar("T")


class BadSettingError(click.ClickException):
    """A setting no command can run with (a database URL no supported async driver
    serves): one line naming the library's error, exit code 2 like click's own usage
    errors, before anything connects."""

    exit_code = 2

    def __init__(self, error: ConfigurationError) -> None:
        super().__init__(f"{type(error).__name__}: {error}")


async def with_client(
    database_url: str,
    table_prefix: str,
    redis: tuple[str | None, str],
    action: Callable[[Client], Awaitable[T]],
) -> T:
    """``action`` on a client of the database and, given a ``(url, prefix)`` of Redis,
    announcing the change there."""
    from queuert_notify.client.client import Client
    from queuert_notify.notify.noop import NoopNotifyAdapter
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

    async def act(state: SqlAlchemyStateAdapter) -> T:
        url, prefix = redis
        notify = NoopNotifyAdapter() if url is None else RedisNotifyAdapter(url, prefix=prefix)
        async with Client(state=state, notify=notify) as client:
            return await action(client)

    return await with_state(database_url, table_prefix, act)


async def with_state(
    database_url: str,
    table_prefix: str,
    action: Callable[[SqlAlchemyStateAdapter], Awaitable[T]],
    *,
    create: bool = False,
) -> T:
    """``action`` on a state adapter of the database, whose engine is disposed after.
    Only with ``create`` (``migrate``) does a SQLite file that did not exist stay behind:
    any other command leaves none (it found no tables there anyway)."""
    from queuert_notify.cli import uncollected

    with uncollected():
        from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

        engine = create_engine(database_url)
    made = [] if create else await asyncio.to_thread(_missing_sqlite_files, engine)
    try:
        await check_reachable(engine, database_url)
        return await action(SqlAlchemyStateAdapter(engine, table_prefix=table_prefix))
    finally:
        await engine.dispose()
        await asyncio.to_thread(_remove, made)


def create_engine(database_url: str, **options: Any) -> AsyncEngine:
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
                "postgresql+psycopg://, postgresql+asyncpg://, postgresql+psycopg2:// "
                "(run on psycopg) or sqlite+aiosqlite:///jobs.db"
            )
        )

    try:
        url = make_url(_async_url(database_url))
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise unsupported("an in-memory SQLite database is private to one connection")
        if url.get_backend_name() == "postgresql":
            options = {"connect_args": _pooler_connect_args(url.get_driver_name()), **options}
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


def _pooler_connect_args(driver: str) -> dict[str, Any]:
    """A command runs each statement a few times at most: nothing to gain from prepared
    statements, and these settings let it run through PgBouncer. (The drivers' module
    is imported here, for Postgres only.)"""
    from state_adapters.drivers import POSTGRES_DRIVERS, driver_for

    return driver_for(driver).pooler_connect_args if driver in POSTGRES_DRIVERS else {}


async def check_reachable(engine: AsyncEngine, database_url: str) -> None:
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
        reason = cannot_connect_reason(exc, engine.url.password)
        sqlite = engine.dialect.name == "sqlite"
        raise ConfigurationError(
            cannot_connect(mask_url(database_url), reason, sqlite=sqlite)
        ) from None


def _missing_sqlite_files(engine: AsyncEngine) -> list[str]:
    """The files SQLite would create for ``engine``'s database, if it does not exist."""
    path = str(engine.url.database)
    if engine.dialect.name != "sqlite" or os.path.exists(path):
        return []
    return [path, f"{path}-wal", f"{path}-shm", f"{path}-journal"]


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _open_sqlite(path: str) -> None:
    sqlite3.connect(path).close()


def _async_url(url: str) -> str:
    """Pick the async driver the project ships when the URL names none, or names the
    sync driver an application's own settings may hold (psycopg2: run on psycopg)."""
    for plain, with_driver in (
        ("postgres://", "postgresql+psycopg://"),
        ("postgresql://", "postgresql+psycopg://"),
        ("postgresql+psycopg2://", "postgresql+psycopg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(plain):
            return with_driver + url[len(plain) :]
    return url
