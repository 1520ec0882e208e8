"""The tables that hold job state, as SQLAlchemy Core objects.

:func:`make_metadata` builds them under any table prefix and schema, so an
application can list them in its own Alembic ``target_metadata`` (or exclude
them) while :meth:`SqlAlchemyStateAdapter.migrate` keeps them up to date with
the migrations shipped in ``state_adapters/migrations``. The migrations and
this module describe the same schema; a test compares them.

Tables (``{prefix}`` defaults to ``queuert_``):

- ``{prefix}chains``: one row per chain; ``completed_at`` is set once, when the
  chain reaches a final status; ``has_dependents`` once a job was blocked on
  it. Both are written under this row's lock, which serializes "the chain
  became final" against "a job is being blocked on this chain". A chain's
  status and output are those of its job with the highest ``chain_index``.
- ``{prefix}jobs``: one row per job; a chain's jobs share ``chain_id`` and are
  numbered by ``chain_index`` (the first job's id is the chain id).
- ``{prefix}blockers``: which chains a blocked job waits for.
  ``jobs.blockers_pending`` counts those not yet final; the job becomes pending
  when it reaches zero.
- ``{prefix}dedup_keys``: the chain that currently owns a deduplication key
  (per chain type); its primary key makes deduplication race-free.
- ``{prefix}schedules``: the last tick each periodic schedule ran, by name. One row
  per schedule (not per tick), so it outlives retention pruning: a pruned chain
  never makes its tick due again.

``chains.completed_at`` has an index of its own (finished chains only), so that
retention finds the oldest finished chains without scanning the table.
- ``{prefix}type_controls``: per job type, whether it is paused and its limits
  (running jobs, running jobs per ``jobs.concurrency_key``, starts per window),
  with what enforcing them needs (the recent starts, the next key to serve). No
  row: the type runs unlimited. Claims of a limited type lock its row.
- ``{prefix}workers``: the running workers, one row each, written when a worker starts,
  on each of its reaper's ticks (the heartbeat) and deleted when it stops cleanly.
- ``{prefix}job_logs``: the lines a job logged (``ctx.log``, ``JobLogHandler``), per
  attempt, numbered by ``seq`` from 1 within the attempt; deleted with the job's chain.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator, TypeEngine

from state_adapters.errors import ConfigurationError

DEFAULT_TABLE_PREFIX = "queuert_"
ID_LENGTH = 32
TYPE_NAME_LENGTH = 200
DEDUP_KEY_LENGTH = 255
WORKER_ID_LENGTH = 255
CONCURRENCY_KEY_LENGTH = 255
STATUS_LENGTH = 16
SCHEDULE_NAME_LENGTH = 200
LOG_LEVEL_LENGTH = 16

DIALECTS = ("postgresql", "sqlite")
"""The databases the tables are described for (SQLAlchemy's dialect names)."""

SETTLED_ASIDE = "status IN ('blocked', 'failed', 'cancelled')"
"""The predicate of ``jobs_status_chain_ix``: the statuses a job reaches off the hot path
(a start with blockers, a last failure, a cancel), so a job that is started, claimed and
completed never enters it. A query that should use the index adds
``SqlDialect.partial_index_term(SETTLED_ASIDE)`` (SQLite needs it word for word)."""
SETTLED_ASIDE_STATUSES = ("blocked", "failed", "cancelled")

_PREFIX_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,29}")


def utc_instant(value: datetime) -> datetime:
    """``value`` in UTC, as the queue stores every time; ValueError for a naive one (an
    instant without a zone is ambiguous). Also what the Django backend binds with."""
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: pass a timezone-aware instant")
    return value.astimezone(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC instant on every dialect.

    Postgres stores ``timestamptz``; SQLite has no time zones, so values are
    stored as naive UTC text (which compares correctly) and come back aware.
    Naive datetimes are refused: an instant without a zone is ambiguous.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = utc_instant(value)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JsonDocument(TypeDecorator[Any]):
    """JSON documents: ``jsonb`` on Postgres, JSON text in a ``TEXT`` column on SQLite.

    The database's type is chosen when an engine first uses the column, not spelled as
    a variant (:func:`ddl_json`), whose ``JSONB`` would load SQLAlchemy's Postgres
    dialect package in every process that builds the tables, on SQLite too.

    On SQLite the column is declared ``TEXT``, not ``JSON``: a declared type of ``JSON``
    has NUMERIC affinity, under which SQLite stores a document that is a bare number as
    a REAL or an INTEGER, and gives back another double now and then
    (``3.505814728493874e-295`` for ``3.5058147284938744e-295``), ``1`` for ``1.0``
    and ``0`` for ``-0.0``. ``TEXT`` keeps the document's text as written (migration
    0011 rebuilds older tables).
    """

    impl = JSON
    cache_ok = True
    should_evaluate_none = True
    """As ``JSON``'s: a Python ``None`` is the JSON ``null``, not SQL ``NULL``."""

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return JSONB()
        if dialect.name == "sqlite":
            return _sqlite_json_text()
        return self.impl_instance


@cache
def _sqlite_json_text() -> TypeEngine[Any]:
    """SQLite's ``JSON`` type (its values as SQLAlchemy writes and reads JSON), in a
    column declared ``TEXT``. Made on first use, like ``JSONB``: the SQLite dialect
    package is loaded by processes on SQLite only."""
    from sqlalchemy.dialects.sqlite import JSON as SqliteJson
    from sqlalchemy.ext.compiler import compiles

    class JsonText(SqliteJson[Any]):
        """SQLite's ``JSON``, declared ``TEXT``."""

    @compiles(JsonText, "sqlite")
    def _declared_text(type_: JsonText, compiler: Any, **kw: Any) -> str:
        return "TEXT"

    return JsonText()


def ddl_json() -> TypeEngine[Any]:
    """The column type :class:`JsonDocument` stores, as SQLAlchemy's own types: the same
    DDL (``jsonb`` on Postgres, ``TEXT`` on SQLite), spelled without this package."""
    from sqlalchemy.dialects.postgresql import JSONB

    return JSON().with_variant(JSONB(), "postgresql").with_variant(Text(), "sqlite")


def json_type() -> TypeEngine[Any]:
    """JSON documents: ``jsonb`` on Postgres, JSON text on SQLite (:class:`JsonDocument`)."""
    return JsonDocument()


def check_table_prefix(table_prefix: str) -> str:
    """Return ``table_prefix`` if it is a safe identifier start (letters, digits,
    ``_``; at most 30 characters, so index names stay under Postgres' 63)."""
    if not isinstance(table_prefix, str) or not _PREFIX_PATTERN.fullmatch(table_prefix):
        raise ConfigurationError(
            f"table_prefix {table_prefix!r} is not allowed: use 1-30 letters, digits or "
            "underscores, starting with a letter or underscore (e.g. 'queuert_')"
        )
    return table_prefix


@dataclass(frozen=True, slots=True)
class Tables:
    """The tables of one prefix/schema, on one :class:`MetaData`."""

    metadata: MetaData
    chains: Table
    jobs: Table
    blockers: Table
    dedup_keys: Table
    schedules: Table
    type_controls: Table
    workers: Table
    job_logs: Table
    table_prefix: str
    schema: str | None

    @property
    def version_table(self) -> str:
        """Name of the migrations' own version table (never the application's)."""
        return f"{self.table_prefix}alembic_version"

    @property
    def claim_function(self) -> str:
        """Name of the Postgres function that claims jobs of limited types (migration
        0007), in the tables' schema."""
        return f"{self.table_prefix}claim_limited"


def ddl_timestamp() -> TypeEngine[datetime]:
    """The column type :class:`UtcDateTime` stores, as SQLAlchemy's own type: the same
    DDL (``timestamptz`` on Postgres, ``DATETIME`` on SQLite) without the conversions."""
    return DateTime(timezone=True)


def make_tables(
    table_prefix: str = DEFAULT_TABLE_PREFIX,
    schema: str | None = None,
    *,
    timestamp: Callable[[], TypeEngine[datetime]] = UtcDateTime,
    json: Callable[[], TypeEngine[Any]] = json_type,
    dialects: Sequence[str] = DIALECTS,
) -> Tables:
    """Build the tables for ``table_prefix`` (and optional ``schema``) on a new MetaData,
    with ``timestamp()`` as the type of every time column and ``json()`` of every JSON
    column, and the partial indexes' predicates for the databases ``dialects`` names
    (SQLAlchemy checks such an option by loading that database's dialect package: an
    adapter names its own database only)."""
    p = check_table_prefix(table_prefix)
    metadata = MetaData(schema=schema)

    def where(predicate: str) -> dict[str, Any]:
        # A partial index's predicate, as an option of each database's dialect.
        return {f"{dialect}_where": text(predicate) for dialect in dialects}

    pending = where("status = 'pending'")
    running = where("status = 'running'")
    settled_aside = where(SETTLED_ASIDE)
    finished = where("completed_at IS NOT NULL")
    has_dedup_key = where("dedup_key IS NOT NULL")
    keyed_pending = where("status = 'pending' AND concurrency_key IS NOT NULL")
    chains = Table(
        f"{p}chains",
        metadata,
        Column("id", String(ID_LENGTH), primary_key=True),
        Column("type_name", String(TYPE_NAME_LENGTH), nullable=False),
        Column("created_at", timestamp(), nullable=False),
        Column("completed_at", timestamp(), nullable=True),
        Column("has_dependents", Boolean, nullable=False),
        Column("dedup_key", String(DEDUP_KEY_LENGTH), nullable=True),
        Index(f"{p}chains_type_ix", "type_name", "id"),
        # Chain search by deduplication key (inspection.py).
        Index(
            f"{p}chains_dedup_ix",
            "dedup_key",
            **has_dedup_key,
        ),
        # Retention reads the oldest finished chains.
        Index(
            f"{p}chains_completed_ix",
            "completed_at",
            **finished,
        ),
    )
    jobs = Table(
        f"{p}jobs",
        metadata,
        Column("id", String(ID_LENGTH), primary_key=True),
        Column("chain_id", String(ID_LENGTH), nullable=False),
        Column("chain_index", Integer, nullable=False),
        Column("type_name", String(TYPE_NAME_LENGTH), nullable=False),
        Column("input", json(), nullable=True),
        Column("output", json(), nullable=True),
        Column("progress", json(), nullable=True),
        Column("status", String(STATUS_LENGTH), nullable=False),
        Column("priority", Integer, nullable=False),
        Column("created_at", timestamp(), nullable=False),
        Column("scheduled_at", timestamp(), nullable=False),
        Column("completed_at", timestamp(), nullable=True),
        Column("attempt", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=True),
        Column("last_error", Text, nullable=True),
        Column("leased_by", String(WORKER_ID_LENGTH), nullable=True),
        Column("lease_token", String(ID_LENGTH), nullable=True),
        Column("leased_until", timestamp(), nullable=True),
        Column("deduplication_key", String(DEDUP_KEY_LENGTH), nullable=True),
        Column("blockers_pending", Integer, nullable=False),
        # Opaque to the queue: what an instrumentation (queuert_notify.otel) stored to
        # continue the trace of the request that started the job.
        Column("trace_context", Text, nullable=True),
        Column("concurrency_key", String(CONCURRENCY_KEY_LENGTH), nullable=True),
        UniqueConstraint("chain_id", "chain_index", name=f"{p}jobs_chain_uq"),
        # Acquisition reads the best pending jobs of some types in this order.
        Index(
            f"{p}jobs_acquire_ix",
            "type_name",
            "priority",
            "scheduled_at",
            "id",
            **pending,
        ),
        # next_due_at: the earliest pending job of some types.
        Index(
            f"{p}jobs_due_ix",
            "type_name",
            "scheduled_at",
            **pending,
        ),
        # The reaper looks for running jobs whose lease expired.
        Index(
            f"{p}jobs_lease_ix",
            "leased_until",
            **running,
        ),
        Index(f"{p}jobs_status_ix", "status", "type_name"),
        # A page of blocked, failed or cancelled chains, newest first (inspection.py);
        # the statuses of the hot path (pending, running, completed) are left out, so
        # starting, claiming and completing a job never writes to it.
        Index(
            f"{p}jobs_status_chain_ix",
            "status",
            "chain_id",
            **settled_aside,
        ),
        # Jobs finished since a moment, by type and status (inspection.py's overview);
        # an entry is added once per job, when it finishes.
        Index(
            f"{p}jobs_finished_ix",
            "completed_at",
            "type_name",
            "status",
            **finished,
        ),
        # Claims of a type with key_concurrency walk its keys that have pending
        # jobs and take each key's best; jobs without a key pay nothing for it.
        Index(
            f"{p}jobs_key_ix",
            "type_name",
            "concurrency_key",
            "priority",
            "scheduled_at",
            "id",
            **keyed_pending,
        ),
    )
    blockers = Table(
        f"{p}blockers",
        metadata,
        Column("job_id", String(ID_LENGTH), nullable=False),
        Column("blocker_chain_id", String(ID_LENGTH), nullable=False),
        PrimaryKeyConstraint("job_id", "blocker_chain_id", name=f"{p}blockers_pk"),
        Index(f"{p}blockers_blocker_ix", "blocker_chain_id"),
    )
    dedup_keys = Table(
        f"{p}dedup_keys",
        metadata,
        Column("type_name", String(TYPE_NAME_LENGTH), nullable=False),
        Column("dedup_key", String(DEDUP_KEY_LENGTH), nullable=False),
        Column("chain_id", String(ID_LENGTH), nullable=False),
        Column("created_at", timestamp(), nullable=False),
        PrimaryKeyConstraint("type_name", "dedup_key", name=f"{p}dedup_keys_pk"),
        Index(f"{p}dedup_keys_chain_ix", "chain_id"),
    )
    schedules = Table(
        f"{p}schedules",
        metadata,
        Column("name", String(SCHEDULE_NAME_LENGTH), primary_key=True),
        Column("last_tick", timestamp(), nullable=False),
        Column("chain_id", String(ID_LENGTH), nullable=True),
        Column("updated_at", timestamp(), nullable=False),
    )
    type_controls = Table(
        f"{p}type_controls",
        metadata,
        Column("type_name", String(TYPE_NAME_LENGTH), primary_key=True),
        Column("paused", Boolean, nullable=False),
        Column("concurrency", Integer, nullable=True),
        Column("key_concurrency", Integer, nullable=True),
        Column("rate", Integer, nullable=True),
        Column("per_seconds", Float, nullable=True),
        # The rate's window (state_adapters.steps.limited_claims.RateWindow): the steps
        # before the newest as [[instant, starts], ...], ...
        Column("recent_starts", json(), nullable=True),
        # The concurrency key served last: the next claim starts after it.
        Column("next_key_after", String(CONCURRENCY_KEY_LENGTH), nullable=True),
        # ... the newest step's end (seconds since the epoch) and starts, kept apart so
        # that a claim within the step changes one number, and the starts of the
        # earlier steps still in the window.
        Column("step_at", Float, nullable=True),
        Column("step_starts", Integer, nullable=False, server_default="0"),
        Column("earlier_starts", Integer, nullable=False, server_default="0"),
    )
    workers = Table(
        f"{p}workers",
        metadata,
        Column("id", String(WORKER_ID_LENGTH), primary_key=True),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("type_names", json(), nullable=False),
        Column("slots", Integer, nullable=False),
        Column("started_at", timestamp(), nullable=False),
        Column("heartbeat_at", timestamp(), nullable=False),
    )
    job_logs = Table(
        f"{p}job_logs",
        metadata,
        Column("job_id", String(ID_LENGTH), nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("seq", Integer, nullable=False),
        Column("at", timestamp(), nullable=False),
        Column("level", String(LOG_LEVEL_LENGTH), nullable=False),
        Column("message", Text, nullable=False),
        Column("fields", json(), nullable=True),
        # A job's lines in order, and the lines after a position (follow).
        Index(f"{p}job_logs_ix", "job_id", "attempt", "seq"),
    )
    return Tables(
        metadata,
        chains,
        jobs,
        blockers,
        dedup_keys,
        schedules,
        type_controls,
        workers,
        job_logs,
        p,
        schema,
    )


def make_metadata(table_prefix: str = DEFAULT_TABLE_PREFIX, schema: str | None = None) -> MetaData:
    """A MetaData holding the queue's tables under ``table_prefix`` and ``schema``,
    e.g. for an application's Alembic ``include_name`` filter or ``target_metadata``.

    Its columns have SQLAlchemy's own types only (time columns are
    ``DateTime(timezone=True)``, the DDL of the adapter's :class:`UtcDateTime`, JSON
    columns :func:`ddl_json`), so a
    revision Alembic autogenerates from it imports nothing from this package and
    creates exactly the tables ``migrate()`` creates.
    """
    return make_tables(table_prefix, schema, timestamp=ddl_timestamp, json=ddl_json).metadata


metadata: MetaData
"""The queue's tables under the default prefix ``queuert_`` and the default schema;
built on first use (:func:`__getattr__`)."""


def __getattr__(name: str) -> Any:
    # metadata's JSONB variant and Postgres index options load SQLAlchemy's Postgres
    # dialect package, which a process on SQLite need not pay for unless it asks.
    if name != "metadata":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["metadata"] = made = make_metadata()
    return made
