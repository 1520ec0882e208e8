"""The queue's own statements, run on a Django connection's cursor.

The state layer writes and reads chains with coroutines that await only the
connection they are given (see :mod:`state_adapters.sync.bridge`). Here that
connection is a Django cursor: every statement is compiled once per database from
the state layer's SQLAlchemy Core definitions and sent with ``cursor.execute``, so it
runs on the Django connection of the task's database alias, in whatever transaction
that connection is in (``transaction.atomic()``), never committed here. Validation,
ids and statements are the state layer's; nothing is re-written in SQL here.

Placeholders: Postgres statements are compiled for the driver of Django's Postgres
backend (``%(name)s`` for both): psycopg 3 whenever it is installed (without the casts
SQLAlchemy writes on its placeholders but for times', see :class:`_CastsOnTimesOnly`;
on Django's client-side binding cursor the values are written into the text here, see
:mod:`queuert_notify.contrib.django.literals`), else psycopg2, whose JSON SQLAlchemy
binds as text (its values are written into the text too). The state adapter that
owns the statements never connects; on psycopg2 it is built on asyncpg's dialect
(psycopg 3 is not importable there, or Django would use it), so asyncpg must be
installed. SQLite statements are compiled with ``%s`` placeholders, which Django's
SQLite cursor turns into ``?`` as it does for its own queries (the queue's go to the
driver's cursor with that conversion done once, see :meth:`CursorConnection.execute`).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from django.db.backends.utils import CursorWrapper
from sqlalchemy import DateTime
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.types import TypeEngine

from queuert_notify.contrib.django.literals import Literals
from queuert_notify.errors import ConfigurationError
from state_adapters.postgres.database import Postgres
from state_adapters.schema import JsonDocument, UtcDateTime, utc_instant
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from state_adapters.statements.compiled import (
    BindProcessor,
    CompiledStatements,
    sqlalchemy_bind_processor,
)
from state_adapters.sync.bridge import SyncConnection


class QueueTables:
    """The state layer for one database vendor and table prefix: a state adapter that
    never connects (it owns the statements and their validation) and the statements
    compiled for the Django connection's driver. Shared by every thread."""

    def __init__(self, vendor: str, *, table_prefix: str, psycopg2: bool = False) -> None:
        # The dialects the statements are compiled for are instances of their own: the
        # state adapter's engine is the only one made.
        dialect: Dialect
        if vendor == "postgresql" and psycopg2:
            twin = _asyncpg_twin()
            dialect = PGDialect_psycopg2()  # type: ignore[no-untyped-call]
        elif vendor == "postgresql":
            twin = create_async_engine("postgresql+psycopg://")
            dialect = _PsycopgCastsOnTimesOnly()  # type: ignore[no-untyped-call]
        elif vendor == "sqlite":
            twin = create_async_engine("sqlite+aiosqlite://")
            dialect = SQLiteDialect_pysqlite(paramstyle="format")
        else:
            raise ConfigurationError(
                f"the queuert task backend supports Postgres and SQLite databases, not "
                f"Django's {vendor!r} backend"
            )
        self.state = SqlAlchemyStateAdapter(twin, table_prefix=table_prefix)
        self.dialect = dialect
        self.psycopg2 = psycopg2
        own_types = vendor == "sqlite" or psycopg2
        self.compiled = CompiledStatements(
            dialect,
            bind_processor=_own_types(vendor) if own_types else sqlalchemy_bind_processor,
        )
        if vendor == "postgresql":
            # The statements the state layer sends as driver SQL (on an engine, to the
            # driver connection under it) go to the Django cursor, compiled for its driver.
            cast(Postgres, self.state.database).compiled = self.compiled
        self.as_stored = _datetimes_as_stored if vendor == "sqlite" else _as_returned
        self.sending = (
            _text_for_psycopg()
            if dialect.driver == "psycopg"
            else _text_for_psycopg2()
            if psycopg2
            else _as_given_to
        )
        self.qmark: Callable[[str], str] | None = _qmark if vendor == "sqlite" else None
        """SQLite: a statement's text with ``?`` placeholders, for the driver's cursor."""

    def on(self, cursor: Any) -> CursorConnection:
        """A connection for the state layer's writes on ``cursor`` (a Django cursor)."""
        return CursorConnection(cursor, self)

    def reading(self, cursor: Any) -> CursorConnection:
        """A connection for the state layer's reads on ``cursor`` (JSON decoded)."""
        if self.psycopg2:
            # As below, for psycopg2: its typecasters, registered on this cursor only.
            from psycopg2.extras import register_default_json, register_default_jsonb

            register_default_json(cursor.cursor, loads=json.loads)
            register_default_jsonb(cursor.cursor, loads=json.loads)
        elif self.dialect.name == "postgresql":
            # Django loads JSON as text (its JSONField decodes it); the queue's
            # statements read it as psycopg does by default. This cursor only.
            from psycopg.types.json import JsonbLoader, JsonLoader

            adapters = cursor.cursor.adapters
            adapters.register_loader("jsonb", JsonbLoader)
            adapters.register_loader("json", JsonLoader)
        return CursorConnection(cursor, self)


def _asyncpg_twin() -> AsyncEngine:
    try:
        return create_async_engine("postgresql+asyncpg://")
    except ImportError:
        raise ConfigurationError(
            "the queuert task backend on Django's psycopg2 backend needs asyncpg installed "
            "(pip install 'queuert-notify[asyncpg]'), or psycopg 3 (pip install "
            "'psycopg[binary]'; Django then uses it)"
        ) from None


_shared: dict[tuple[str, str, bool], QueueTables] = {}
_shared_lock = threading.Lock()


def queue_tables(vendor: str, *, table_prefix: str, psycopg2: bool = False) -> QueueTables:
    """The :class:`QueueTables` of a vendor, prefix and driver (made once)."""
    key = (vendor, table_prefix, psycopg2)
    tables = _shared.get(key)
    if tables is None:
        with _shared_lock:
            tables = _shared.get(key)
            if tables is None:
                tables = _shared[key] = QueueTables(
                    vendor, table_prefix=table_prefix, psycopg2=psycopg2
                )
    return tables


class _CastsOnTimesOnly(PGCompiler_psycopg):
    """psycopg 3's compiler without the casts of its placeholders (``%(id)s::VARCHAR``),
    but for times'.

    SQLAlchemy writes them for psycopg's server-side binding. On Django's cursor a value
    arrives as a literal in the statement's text, where an untyped one takes the type of
    the column it is written to or compared with, as on psycopg2 (whose dialect writes
    no casts and whose literals only times carry one). A time is sent as text (see
    :func:`_text_for_psycopg`), which a select list would read as text: it keeps its
    cast. Parsing the 14 other casts of an enqueue's statement cost the server more than
    the rest of its parse (about 30 µs of 350 at a load average of 4).
    """

    def render_bind_cast(self, type_: Any, dbapi_type: Any, sqltext: str) -> str:
        if isinstance(dbapi_type, DateTime):
            cast_text = super().render_bind_cast(type_, dbapi_type, sqltext)  # type: ignore[no-untyped-call]
            return str(cast_text)
        return sqltext


class _PsycopgCastsOnTimesOnly(PGDialect_psycopg):
    """psycopg 3's dialect with :class:`_CastsOnTimesOnly` for its compiler."""

    statement_compiler = _CastsOnTimesOnly


class CursorConnection(SyncConnection):
    """What the state layer awaits of a connection, done at once on a Django cursor
    (in its connection's transaction, which stays Django's)."""

    __slots__ = ("_as_sent", "_cursor", "_direct", "_render", "_tables")

    def __init__(self, cursor: Any, tables: QueueTables) -> None:
        self._cursor = cursor
        self._tables = tables
        self._as_sent, self._render = tables.sending(cursor)
        # SQLite: the statements go past Django's cursor wrapper (see execute()) unless
        # something watches the connection's queries: an execute_wrapper(), the debug
        # cursor (DEBUG, CaptureQueriesContext) that logs them to connection.queries, or
        # an instrumentation that replaced the wrapper's execute() (APM agents do).
        self._direct = (
            tables.qmark is not None
            and type(cursor) is CursorWrapper
            and not cursor.db.execute_wrappers
            and _djangos_own(CursorWrapper.execute)
        )

    @property
    def dialect(self) -> Dialect:
        return self._tables.dialect

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        compiled = self._tables.compiled(statement)
        if isinstance(parameters, Sequence) and not isinstance(parameters, Mapping):
            if len(parameters) != 1:
                sent = [self._as_sent(compiled.arguments(r)) for r in parameters]
                self._cursor.executemany(compiled.sql, sent)
                return Rows([], self._cursor.rowcount)
            # A batch of one row (an enqueue's chain and job on SQLite): execute() costs
            # less than executemany(), which Django's SQLite cursor runs through a tee().
            parameters = parameters[0]
        arguments = compiled.arguments(parameters or {})
        if self._direct:
            assert self._tables.qmark is not None
            db = self._cursor.db
            driver = self._cursor.cursor
            # What Django's CursorWrapper does around its driver's execute() (past its
            # SQLite cursor's conversion of the placeholders, done once in _qmark).
            db.validate_no_broken_transaction()
            with db.wrap_database_errors:
                sqlite3.Cursor.execute(driver, self._tables.qmark(compiled.sql), arguments)
                rows, count = _result(driver)
        else:
            self._run(compiled.sql, arguments)
            rows, count = _result(self._cursor)
        return Rows(compiled.typed(self._tables.as_stored(rows)) if rows else [], count)

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return (await self.execute(statement, parameters)).scalar()

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        self._run(statement, parameters)
        return Rows(*_result(self._cursor))

    def _run(self, sql: str, arguments: Any) -> None:
        text = None
        if self._render is not None and isinstance(arguments, dict):
            text = self._render(sql, arguments)
        if text is None:
            self._cursor.execute(sql, self._as_sent(arguments))
        else:
            self._cursor.execute(text)


class Rows:
    """The part of a SQLAlchemy ``Result`` the state layer reads."""

    __slots__ = ("_rows", "rowcount")

    returns_rows = True

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Any:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return self._rows

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def mappings(self) -> Rows:
        return Rows([row._asdict() for row in self._rows], self.rowcount)


def _as_returned(rows: list[Any]) -> list[Any]:
    return rows


def _as_given(arguments: Any) -> Any:
    return arguments


Sending = tuple[Callable[[Any], Any], Callable[[str, Mapping[str, Any]], str | None] | None]
"""How a cursor gets a statement's arguments: as driver arguments, and (psycopg 3's
client-side binding cursor, psycopg2's) as the statement's text with them written in (see
:mod:`queuert_notify.contrib.django.literals`; ``None`` from it: the driver binds)."""


def _as_given_to(cursor: Any) -> Sending:
    return _as_given, None


def _text_for_psycopg() -> Callable[[Any], Sending]:
    """psycopg 3: how a Django cursor gets the driver arguments. A client-side binding
    cursor (Django's default) gets the statement with its values written in
    (:class:`~queuert_notify.contrib.django.literals.Literals`), or, where psycopg binds
    them, times and JSON documents as their text.

    The server reads the same values: a time's placeholder keeps its cast
    (``%(at)s::TIMESTAMP WITH TIME ZONE``, :class:`_CastsOnTimesOnly`), and an untyped
    literal takes its column's type (a document its ``jsonb``). But psycopg quotes
    every value into the statement's text on every run, and there its datetime and JSON
    dumpers cost several times a string's quoting (an enqueue's 17 values: 58 µs as
    dumped, 21 as text, at a load of 4). A server-binding cursor
    (``server_side_binding``) sends them typed, as psycopg dumps them.
    """
    # Imported here: beside Django's psycopg2 backend psycopg 3 may be missing.
    from psycopg import ClientCursor

    literals = Literals()
    text_of = literals.as_text

    def as_text(arguments: Any) -> Any:
        # Changed in place: each is a new mapping, made by CompiledStatement.arguments.
        if isinstance(arguments, dict):
            for name, value in arguments.items():
                convert = text_of.get(type(value))
                if convert is not None:
                    arguments[name] = convert(value)
        return arguments

    def sending(cursor: Any) -> Sending:
        if isinstance(cursor.cursor, ClientCursor):
            return as_text, literals.renderer(cursor.cursor)
        return _as_given, None

    return sending


def _text_for_psycopg2() -> Callable[[Any], Sending]:
    """psycopg2: the statement with its values written in
    (:class:`~queuert_notify.contrib.django.literals.Literals`), else psycopg2 binds them."""
    literals = Literals(psycopg2=True)

    def sending(cursor: Any) -> Sending:
        return _as_given, literals.renderer(cursor.cursor)

    return sending


def _datetimes_as_stored(rows: list[Any]) -> list[Any]:
    """SQLite: Django's connection converts DATETIME columns to ``datetime`` (its
    converters); the statements' result processors parse the stored text."""
    return [
        [value.isoformat(" ") if isinstance(value, datetime) else value for value in row]
        for row in rows
    ]


def _djangos_own(method: Any) -> bool:
    """Whether ``method`` of Django's ``CursorWrapper`` is Django's own, not one an
    instrumentation put in its place (with or without ``functools.wraps``)."""
    return method.__module__ == CursorWrapper.__module__ and not hasattr(method, "__wrapped__")


@functools.cache
def _qmark(sql: str) -> str:
    """``sql`` (with ``%s`` placeholders) as Django's SQLite cursor sends it: its own
    conversion, a regular expression it would run on every statement."""
    from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX

    converted: str = FORMAT_QMARK_REGEX.sub("?", sql).replace("%%", "%")
    return converted


def _own_types(vendor: str) -> BindProcessor:
    """SQLite and psycopg2: the queue's times and JSON documents bound as SQLAlchemy
    binds them, without its processors' layers: a time as SQLite stores it (naive UTC
    text, microseconds always written) or, for psycopg2, in UTC; a document as its
    ``json.dumps`` text. Any other type as SQLAlchemy binds it (text and integers
    untouched). The arguments of an enqueue's two SQLite statements: 8 µs against 14
    with SQLAlchemy's processors (timed alone, 20,000 runs)."""
    time = _stored_time if vendor == "sqlite" else _utc_time

    def bind_processor(type_: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
        if isinstance(type_, UtcDateTime):
            return time
        if isinstance(type_, JsonDocument):
            return json.dumps
        return sqlalchemy_bind_processor(type_, dialect)

    return bind_processor


def _result(cursor: Any) -> tuple[list[Any], int]:
    """The rows the cursor's statement returned (none for a statement without rows) and
    its row count."""
    return (cursor.fetchall() if cursor.description is not None else []), cursor.rowcount


def _stored_time(value: datetime | None) -> str | None:
    """A time as :class:`~state_adapters.schema.UtcDateTime` stores it on SQLite."""
    if value is None:
        return None
    # Without its "+00:00": a third of the time of replace(tzinfo=None) first.
    return utc_instant(value).isoformat(" ", "microseconds")[:-6]


def _utc_time(value: datetime | None) -> datetime | None:
    """A time as :class:`~state_adapters.schema.UtcDateTime` binds it on Postgres."""
    return None if value is None else utc_instant(value)
