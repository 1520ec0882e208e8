"""Statements shaped for Postgres (see :class:`~state_adapters.sql_dialect.SqlDialect`
for what each method promises)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, bindparam, func, select, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement


class PostgresSql:
    """Row locks with ``SKIP LOCKED``, materialized claim CTEs, expanding ``IN`` lists,
    server-made lease tokens, and claims that commit without waiting for the WAL."""

    name = "postgresql"

    def commit_without_flush(self) -> ColumnElement[bool]:
        setting = func.set_config("synchronous_commit", "off", true())
        return select(setting).scalar_subquery().is_not(None)

    def insert_or_ignore(self, table: Any) -> Any:
        return postgresql.insert(table).on_conflict_do_nothing()

    def random_token(self) -> ColumnElement[str]:
        return func.replace(func.cast(func.gen_random_uuid(), postgresql.TEXT), "-", "")

    def claim_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(skip_locked=True, key_share=True)

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(skip_locked=True)

    def id_in_selected(
        self, id_column: ColumnElement[Any], selected: Select[Any]
    ) -> ColumnElement[bool]:
        claimed = selected.cte("selected").prefix_with("MATERIALIZED")
        return id_column.in_(select(claimed.c[0]).scalar_subquery())

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        return column.in_(bindparam(name, expanding=True))

    def without_index(self, expression: ColumnElement[Any]) -> ColumnElement[Any]:
        return expression

    def share_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update(read=True)

    def update_lock(self, select: Select[Any]) -> Select[Any]:
        return select.with_for_update()
