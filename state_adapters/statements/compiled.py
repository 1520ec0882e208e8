"""The statements a worker repeats, compiled once and sent as driver SQL.

Executing a Core statement makes SQLAlchemy look its compiled form up by a
cache key computed from the whole statement tree, then build the parameters
and the result's type processing again: about a third of the CPU of a claim
of ten jobs. A worker claims and completes thousands of times a second with
statements of fixed shape, so :class:`CompiledStatement` does that work once
per dialect and sends the string, with its parameters bound by the driver: on
Postgres's asyncio engines to the driver connection under the SQLAlchemy connection,
in its transaction (:func:`state_adapters.drivers.run_on_driver`: without SQLAlchemy's
cursor and result machinery, still with the engine's cursor events, its error wrapping
and invalidation of a broken connection); elsewhere with ``exec_driver_sql`` on the
SQLAlchemy connection (``SyncClient``'s sync engines). On SQLite a worker's transaction
goes to the driver itself: see :mod:`state_adapters.sqlite.driver`.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

_Processor = Callable[[Any], Any]
BindProcessor = Callable[[TypeEngine[Any], Dialect], _Processor | None]
"""A bound value's processor for a parameter's type on a dialect (``None``: none)."""


def sqlalchemy_bind_processor(type_: TypeEngine[Any], dialect: Dialect) -> _Processor | None:
    """The processor SQLAlchemy binds a value of ``type_`` with on ``dialect``."""
    return type_.dialect_impl(dialect).bind_processor(dialect)


class DriverSqlResult(Protocol):
    """What :class:`CompiledStatement` reads of ``exec_driver_sql``'s result."""

    @property
    def returns_rows(self) -> bool: ...

    def all(self) -> Sequence[Any]: ...


RunSql = Callable[[Any, str, Any], Awaitable[Sequence[Any]]]
"""Runs a compiled statement's SQL with the driver's arguments on a connection; its rows."""


class SendsDriverSql(Protocol):
    """A connection that runs SQL strings: a SQLAlchemy ``AsyncConnection``, or
    :class:`~state_adapters.sqlite.driver.DriverTransaction`."""

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any: ...


class CompiledStatement:
    """``statement`` compiled for ``dialect``: :meth:`rows` runs it with the given
    parameters (named as in the statement) and returns its rows typed as
    ``conn.execute(statement)`` would, as named tuples.

    Invariants: the SQL is compiled once; every bound value, given or constant,
    goes through its type's bind processor (or one equal to it, see
    :class:`CompiledStatements`) and every returned column through its type's result
    processor, as SQLAlchemy itself does; the statement has no
    expanding (``IN``-list) parameters, whose SQL would depend on the values.
    """

    def __init__(
        self,
        statement: ClauseElement,
        dialect: Dialect,
        run: RunSql | None = None,
        bind_processor: BindProcessor = sqlalchemy_bind_processor,
    ) -> None:
        self._run = run
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        if "POSTCOMPILE" in compiled.string:
            raise ValueError("a compiled statement cannot have expanding parameters")
        self.sql = compiled.string
        self._order: Sequence[str] | None = (
            list(compiled.positiontup or ()) if compiled.positional else None
        )
        self._bind: dict[str, _Processor] = {}
        for parameter, name in compiled.bind_names.items():
            processor = bind_processor(parameter.type, dialect)
            if processor is not None:
                self._bind[name] = processor
        bind = self._bind
        self._constants: dict[str, Any] = {
            name: bind[name](value) if name in bind else value
            for name, value in compiled.params.items()
        }
        # Each placeholder's name, processor and constant, in the order of the driver's
        # arguments: arguments() walks the statement's names once, however wide the
        # row it is given (a first job's insert takes 12 of its 22 columns).
        self._steps = [
            (name, bind.get(name), self._constants[name])
            for name in (self._order if self._order is not None else self._constants)
        ]
        columns = list(getattr(statement, "exported_columns", None) or [])
        processors = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
        self._results = [(i, p) for i, p in enumerate(processors) if p is not None]
        self._row: Any = namedtuple("_Row", [c.key for c in columns], rename=True)  # type: ignore[misc]

    def arguments(self, params: Mapping[str, Any]) -> Any:
        """The driver's arguments for ``params``: a mapping, or a tuple in the order of
        the placeholders for a positional driver (the statement's other parameters
        keep the values compiled into it; names it does not have are ignored)."""
        values = [
            constant
            if name not in params
            else params[name]
            if processor is None
            else processor(params[name])
            for name, processor, constant in self._steps
        ]
        if self._order is None:
            return dict(zip(self._constants, values, strict=True))
        return tuple(values)

    async def rows(self, conn: SendsDriverSql, params: Mapping[str, Any]) -> list[Any]:
        """Run the statement on ``conn`` with ``params`` (see :meth:`arguments`), through
        the ``run`` it was made with, or ``exec_driver_sql``."""
        if self._run is not None:
            return self.typed(await self._run(conn, self.sql, self.arguments(params)))
        result: DriverSqlResult = await conn.exec_driver_sql(self.sql, self.arguments(params))
        if not result.returns_rows:
            return []
        return self.typed(result.all())

    def typed(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """Driver rows as named tuples of the statement's columns, typed."""
        make = self._row._make
        if not self._results:
            return [make(row) for row in rows]
        typed = []
        for row in rows:
            values = list(row)
            for index, processor in self._results:
                values[index] = processor(values[index])
            typed.append(make(values))
        return typed


class CompiledStatements:
    """A cache of :class:`CompiledStatement` per statement object, for one dialect.

    Only for statements built once (of fixed shape): each statement object given is
    kept for the cache's lifetime. ``run``: how their SQL is sent (see
    :meth:`CompiledStatement.rows`); ``bind_processor``: the processor of a parameter's
    type (SQLAlchemy's unless given: one equal to it, that costs less)."""

    def __init__(
        self,
        dialect: Dialect,
        run: RunSql | None = None,
        bind_processor: BindProcessor = sqlalchemy_bind_processor,
    ) -> None:
        self._dialect = dialect
        self._run = run
        self._bind_processor = bind_processor
        self._compiled: dict[Executable, CompiledStatement] = {}

    def __call__(self, statement: Executable) -> CompiledStatement:
        compiled = self._compiled.get(statement)
        if compiled is None:
            clause = cast(ClauseElement, statement)
            compiled = self._compiled[statement] = CompiledStatement(
                clause, self._dialect, self._run, self._bind_processor
            )
        return compiled
