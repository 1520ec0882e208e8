"""Statements shaped for SQLite (see :class:`~state_adapters.sql_dialect.SqlDialect`
for what each method promises). Every write transaction holds the database (``BEGIN
IMMEDIATE``), so row locks are not needed and are left out."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Select, bindparam, func, select, true
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.elements import ColumnElement, UnaryExpression
from sqlalchemy.sql.operators import custom_op


class SqliteSql:
    """One-shape ``IN`` lists through ``json_each`` (so statements compile once),
    ``+column`` terms that keep the planner off the wrong index, tokens from
    ``randomblob``."""

    name = "sqlite"

    def commit_without_flush(self) -> ColumnElement[bool]:
        return true()

    def insert_or_ignore(self, table: Any) -> Any:
        return sqlite.insert(table).on_conflict_do_nothing()

    def random_token(self) -> ColumnElement[str]:
        return func.lower(func.hex(func.randomblob(16)))

    def claim_lock(self, select: Select[Any]) -> Select[Any]:
        return select

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select

    def id_in_selected(
        self, id_column: ColumnElement[Any], selected: Select[Any]
    ) -> ColumnElement[bool]:
        return id_column.in_(selected.scalar_subquery())

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        values = func.json_each(bindparam(name, type_=JSON())).table_valued("value")
        return column.in_(select(values.c.value).scalar_subquery())

    def without_index(self, expression: ColumnElement[Any]) -> ColumnElement[Any]:
        return UnaryExpression(expression, operator=custom_op("+"), type_=expression.type)

    def share_lock(self, select: Select[Any]) -> Select[Any]:
        return select

    def update_lock(self, select: Select[Any]) -> Select[Any]:
        return select
