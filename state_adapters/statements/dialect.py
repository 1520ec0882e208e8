"""The SQL that differs between Postgres and SQLite, behind one small interface
chosen once with the adapter's :class:`~state_adapters.database.Database`: the
statements ask it, and never test a dialect themselves. Implementations:
:class:`state_adapters.postgres.database.PostgresSql`,
:class:`state_adapters.sqlite.database.SqliteSql`."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Select
from sqlalchemy.sql.elements import ColumnElement, TextClause


class SqlDialect(Protocol):
    """How a statement is shaped for one database."""

    name: str

    def commit_without_flush(self) -> ColumnElement[bool]:
        """A term that is always true and, on Postgres, makes the transaction of the
        statement it is in commit without waiting for its WAL to reach the disk
        (``synchronous_commit = off`` for that transaction only).

        Only for a statement whose loss in a server crash costs nothing but a repeat:
        a claim. A claim that did not survive leaves its job pending, as if never
        claimed; the worker's completion is then refused (its lease token is unknown)
        and the job runs again, as after a worker crash. Any later durable commit
        flushes the claim with it.
        """
        ...

    def insert_or_ignore(self, table: Any) -> Any:
        """``INSERT ... ON CONFLICT DO NOTHING`` for the dialect in use.

        On Postgres a conflicting row inserted by a transaction still in progress
        makes this wait for that transaction; once it commits, the next statement
        sees its row.
        """
        ...

    def random_token(self) -> ColumnElement[str]:
        """A fresh random 32-hex-digit token per row (lease tokens)."""
        ...

    def claim_lock(self, select: Select[Any]) -> Select[Any]:
        """Lock the selected rows for a claim, skipping rows another claimer holds.

        ``FOR NO KEY UPDATE`` rather than ``FOR UPDATE`` so inserts that reference
        the row are not blocked. SQLite needs nothing: the writer holds the database.
        """
        ...

    def skip_locked(self, select: Select[Any]) -> Select[Any]:
        """Lock the selected rows for update, skipping rows another transaction holds
        (Postgres ``FOR UPDATE SKIP LOCKED``; SQLite holds the database already)."""
        ...

    def id_in_selected(
        self, id_column: ColumnElement[Any], selected: Select[Any]
    ) -> ColumnElement[bool]:
        """``id_column IN (selected)``, with ``selected`` evaluated exactly once.

        Postgres may re-run a ``LIMIT ... SKIP LOCKED`` subquery for every outer
        row and so claim more rows than the limit; a materialized CTE runs once.
        """
        ...

    def in_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column IN (the values of the list bound as name)``.

        Postgres: an expanding parameter, one placeholder per value. SQLite: the list
        as one JSON parameter read with ``json_each``, so the statement has one shape
        whatever the number of values and can be compiled once
        (:class:`~state_adapters.statements.compiled.CompiledStatement`).
        """
        ...

    def without_index(self, expression: ColumnElement[Any]) -> ColumnElement[Any]:
        """``expression`` as a term no index may serve (SQLite: ``+expression``).

        SQLite's planner picks one index per table and, with or without statistics,
        sometimes picks the one that matches the most terms rather than the one that
        yields rows in the wanted order or the fewest rows (it would scan every
        pending job through ``status = 'pending'``, or sort every due job to claim
        ten). Postgres costs its plans well, so it gets the expression unchanged.
        """
        ...

    def partial_index_term(self, predicate: str) -> ColumnElement[bool] | TextClause:
        """The ``predicate`` of a partial index, as a term for a query that should use
        that index. SQLite uses a partial index only when the query names its predicate
        word for word; Postgres proves it from the query's own terms, and a restated
        predicate only skews its row estimates (it would then sort rather than walk the
        index in order), so it gets nothing."""
        ...

    def minute_of(self, instant: ColumnElement[Any]) -> ColumnElement[Any]:
        """The UTC minute ``instant`` falls in, as a value of the same column type
        (Postgres ``date_trunc``, SQLite ``strftime`` on the stored UTC text)."""
        ...

    def clock(self, given: ColumnElement[Any]) -> ColumnElement[Any]:
        """The current instant on the database's clock, for a term that judges time
        every worker shares (lease expiry): Postgres ``now()``, the server's clock,
        whatever the workers' clocks say. SQLite runs inside the worker's process, so
        its clock is that process's: ``given``, the instant the caller bound."""
        ...

    def share_lock(self, select: Select[Any]) -> Select[Any]:
        """Lock rows against concurrent updates until commit (Postgres ``FOR SHARE``)."""
        ...

    def update_lock(self, select: Select[Any]) -> Select[Any]:
        """Lock rows for update until commit (Postgres ``FOR UPDATE``)."""
        ...
