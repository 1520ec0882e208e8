"""Postgres LISTEN/NOTIFY notifications; no wake budgets (every consume grants a wake).

Wire layout (``prefix`` defaults to ``queuert``):

====================  =========================  =============
what                  channel                    payload
====================  =========================  =============
jobs became pending   ``{prefix}_sched``         the type name
chain completed       ``{prefix}_chainc``        the chain id
ownership lost        ``{prefix}_owls``          the job id
====================  =========================  =============

NOTIFY reaches only sessions connected to the same *database*: point the
adapter at the database that holds the job tables.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncConnection as SaAsyncConnection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.errors import ConfigurationError
from queuert_notify.notify.channel_adapter import ChannelNotifyAdapter
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from queuert_notify.notify.payloads import check_count, encode_payload
from queuert_notify.notify.postgres_listener import ListenConnection
from queuert_notify.notify.shared_listener import SharedListener
from state_adapters.notifications import NotificationBuffer

logger = logging.getLogger(__name__)

_PREFIX = re.compile(r"[A-Za-z0-9_.-]+")
_MAX_CHANNEL_BYTES = 63  # NAMEDATALEN - 1: longer LISTEN names are truncated, pg_notify refuses

# One statement for any number of notifications: one round trip.
_NOTIFY_ONE = "SELECT pg_notify(%s, %s)"
_NOTIFY_MANY = "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS n(c, p)"
_NOTIFY_MANY_SQLALCHEMY = text(
    "SELECT pg_notify(c, p) "
    "FROM unnest(CAST(:channels AS text[]), CAST(:payloads AS text[])) AS n(c, p)"
)

CallerConnection = AsyncSession | SaAsyncConnection | psycopg.AsyncConnection[Any]
"""A connection or session of the caller whose open transaction a NOTIFY joins."""


def channel_name(prefix: str, kind: str) -> str:
    """The LISTEN/NOTIFY channel of one notification kind (``sched``, ``chainc``, ``owls``)."""
    return f"{prefix}_{kind}"


class PostgresNotifyAdapter(ChannelNotifyAdapter):
    """Notifications over Postgres LISTEN/NOTIFY; wake hints are no-ops.

    Guarantees:

    - ``dsn_or_engine`` is a libpq DSN (``postgresql://``, ``postgres://``,
      ``postgresql+psycopg://`` or ``key=value``) or an SQLAlchemy engine on
      PostgreSQL; the adapter opens connections of its own and never touches
      the engine's pool.
    - One dedicated LISTEN connection per adapter, shared by every listener:
      opened on the first ``listen_*`` call, closed when the last listener
      leaves (the ownership-lost channel, once listened, stays LISTENed until
      ``close()``: a worker listens on it for every run). A listener registered
      by an awaited ``listen_*`` call hears every later notification (the call
      returns after LISTEN ran).
    - Publishing uses ``pg_notify`` on a second connection (autocommit);
      ``notify_jobs_scheduled`` is one statement, one round trip.
      :meth:`notify_in_transaction` publishes inside the caller's transaction
      instead, so Postgres delivers on COMMIT and drops on ROLLBACK.
    - Wake hints are not kept: ``provide_wake_hint`` does nothing and
      ``consume_wake_hint`` always returns True (``SKIP LOCKED`` sorts out who
      gets the jobs).
    - Payloads that are empty, longer than :data:`MAX_PAYLOAD_BYTES` or
      holding NUL are dropped and counted in :attr:`ignored_messages`
      (:mod:`~queuert_notify.notify.payloads`).
    - When the LISTEN connection is lost (server restart, terminated backend),
      it reconnects with backoff, LISTENs every live channel again, then runs
      the ``on_reconnect`` callbacks: notifications may have been missed
      (:class:`~queuert_notify.notify.postgres_listener.ListenConnection`).
    - ``close()`` is idempotent, bounded by ``close_timeout``, and leaves no
      task running; afterwards calls raise ``NotifyAdapterClosedError``.

    **LISTEN needs a direct connection to Postgres.** Through a pooler in transaction
    mode (PgBouncer) the LISTEN lands on a server connection the pooler hands to other
    clients after the statement, and notifications never arrive. When
    ``dsn_or_engine`` goes through one, pass ``listen_url`` (the server's own address)
    for the LISTEN connection; publishing (``pg_notify``) works through the pooler. A
    LISTEN connection that turns out to go through a pooler is logged as a warning
    (workers then find jobs on their poll). Behind PgBouncer, Redis or NATS keep
    millisecond wakeups (docs/databases.md, "Behind PgBouncer").

    While Postgres is unreachable, ``notify_*`` and ``listen_*`` calls raise
    ``psycopg.OperationalError``: notifications are hints, so callers log and
    rely on polling.
    """

    _ADAPTER_NAME = "PostgresNotifyAdapter"
    # Postgres delivers identical notifications of one transaction once: each publish
    # stays a statement of its own, so every publish is delivered.
    _BATCH_PUBLISHES = False

    def __init__(
        self,
        dsn_or_engine: str | AsyncEngine | Engine,
        *,
        prefix: str = "queuert",
        connect_timeout: float = 5.0,
        close_timeout: float = 5.0,
        listen_url: str | None = None,
    ) -> None:
        if not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"Postgres prefix {prefix!r} is not allowed: use letters, digits, '_', '.' or '-'"
            )
        if len(channel_name(prefix, "chainc").encode()) > _MAX_CHANNEL_BYTES:
            raise ConfigurationError(
                f"Postgres prefix {prefix!r} is too long: channel names are limited to "
                f"{_MAX_CHANNEL_BYTES} bytes, so keep the prefix within {_MAX_CHANNEL_BYTES - 7}"
            )
        self._conninfo = _conninfo(dsn_or_engine)
        self._listen_conninfo = self._conninfo if listen_url is None else _conninfo(listen_url)
        super().__init__(
            prefix=prefix,
            address=_describe(self._conninfo),
            channel_name=channel_name,
            listener=SharedListener(self._subscribe, self._unsubscribe),
        )
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._publisher: psycopg.AsyncConnection[Any] | None = None
        self._publisher_lock = asyncio.Lock()
        self._listening = ListenConnection(
            open_connection=self._open_connection,
            live_channels=lambda: self._listener.channels,
            deliver=self._deliver,
            on_restored=self._fire_reconnect,
            check_open=self._check_open,
            log=self._log,
            name=f"queuert-notify postgres {prefix}",
        )

    # -- lifecycle -----------------------------------------------------------

    async def connect(self) -> None:
        """Open the publishing connection; idempotent. The LISTEN connection opens
        with the first listener.

        Raises ConfigurationError naming the (password-free) address when
        Postgres does not answer within ``connect_timeout``.
        """
        await self._connect_once(self._open)

    async def _open(self) -> None:
        try:
            await self._publishing_connection()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise ConfigurationError(
                f"cannot reach Postgres at {self._address}: {reason.strip()}; "
                "is the server running and the DSN right?"
            ) from exc

    async def close(self) -> None:
        """Stop the reader and recovery, drop every listener, close both connections;
        idempotent."""
        await self._close_once(
            self._shut_down, self._close_timeout, logger, "postgres notify adapter close timed out"
        )

    async def _shut_down(self) -> None:
        await self._listening.close()
        await self._listener.dispose()
        self._reconnect_callbacks.clear()
        async with self._publisher_lock:
            if self._publisher is not None:
                await self._publisher.close()
                self._publisher = None

    async def notify_in_transaction(
        self,
        connection: CallerConnection,
        *,
        jobs_scheduled: Mapping[str, int] | None = None,
        chains_completed: Iterable[str] = (),
        jobs_ownership_lost: Iterable[str] = (),
    ) -> None:
        """Issue the notifications inside the caller's open transaction, in one statement.

        ``connection`` is an SQLAlchemy ``AsyncSession`` or ``AsyncConnection``
        or a psycopg ``AsyncConnection`` on the database this adapter listens
        to. Postgres itself delivers the notifications when that transaction
        commits and drops them when it (or the savepoint they were issued in)
        rolls back; the caller commits, never this method. Types with a count
        of 0 are skipped; hint counts are otherwise ignored (no budgets here).
        """
        self._check_open()
        messages = self._messages(jobs_scheduled or {}, chains_completed, jobs_ownership_lost)
        if not messages:
            return
        channels, payloads = [m[0] for m in messages], [m[1] for m in messages]
        if isinstance(connection, psycopg.AsyncConnection):
            await connection.execute(_NOTIFY_MANY, (channels, payloads))
            return
        if isinstance(connection, AsyncSession):
            connection = await connection.connection()
        if not isinstance(connection, SaAsyncConnection):
            raise ConfigurationError(
                "notify_in_transaction needs an SQLAlchemy AsyncSession or AsyncConnection "
                f"or a psycopg AsyncConnection, not {type(connection).__name__}"
            )
        if connection.dialect.name != "postgresql":
            raise ConfigurationError(
                f"notify_in_transaction needs a PostgreSQL connection, not "
                f"{connection.dialect.name}; publish after commit with notify_jobs_scheduled"
            )
        await connection.execute(
            _NOTIFY_MANY_SQLALCHEMY, {"channels": channels, "payloads": payloads}
        )

    def notify_in_sync_transaction(self, connection: Connection, notes: NotificationBuffer) -> None:
        """``notes`` as NOTIFYs inside the caller's open synchronous transaction, in one
        statement (for ``SyncClient``): delivered when it commits, dropped when it or the
        savepoint they were issued in rolls back."""
        self._check_open()
        if connection.dialect.name != "postgresql":
            raise ConfigurationError(
                "PostgresNotifyAdapter notifies inside the transaction, so SyncClient needs "
                f"a PostgreSQL engine with it, not {connection.dialect.name}"
            )
        messages = self._messages(notes.scheduled, notes.completed_chains, notes.lost_jobs)
        if messages:
            channels, payloads = [m[0] for m in messages], [m[1] for m in messages]
            connection.execute(
                _NOTIFY_MANY_SQLALCHEMY, {"channels": channels, "payloads": payloads}
            )

    # -- wake hints (not kept) -------------------------------------------------

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Does nothing: LISTEN/NOTIFY keeps no budgets."""
        check_count(count)
        encode_payload("type name", type_name)
        self._check_open()

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Always True: without budgets every listener wakes."""
        self._check_open()
        return True

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Notify every type with a count above 0, in one statement (one round trip)."""
        await self._publish(self._messages(counts, (), ()))

    # -- publishing ------------------------------------------------------------

    def _messages(
        self,
        scheduled: Mapping[str, int],
        chains_completed: Iterable[str],
        jobs_ownership_lost: Iterable[str],
    ) -> list[tuple[str, str]]:
        messages = [
            (self._sched, encode_payload("type name", name))
            for name, count in scheduled.items()
            if check_count(count) > 0
        ]
        messages += [(self._chainc, encode_payload("chain id", c)) for c in chains_completed]
        messages += [(self._owls, encode_payload("job id", j)) for j in jobs_ownership_lost]
        return messages

    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        await self._ready()
        if not messages:
            return
        if len(messages) == 1:
            query: str = _NOTIFY_ONE
            params: tuple[object, ...] = messages[0]
        else:
            query = _NOTIFY_MANY
            params = ([m[0] for m in messages], [m[1] for m in messages])
        conn = await self._publishing_connection()
        try:
            await conn.execute(query, params)
        except psycopg.OperationalError:
            if not conn.broken and not conn.closed:
                raise
            # A connection gone stale (server restart, terminated backend) is
            # replaced once; a duplicate notification is harmless.
            logger.info("postgres publishing connection lost; reopening", extra=self._log)
            conn = await self._publishing_connection()
            await conn.execute(query, params)

    async def _publishing_connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._publisher_lock:
            self._check_open()
            conn = self._publisher
            if conn is None or conn.closed or conn.broken:
                if conn is not None:
                    await conn.close()
                self._publisher = None
                conn = await self._open_connection("publisher", {})
                self._publisher = conn
            return conn

    # -- listening (the LISTEN connection is postgres_listener.ListenConnection) --

    async def _subscribe(self, channel: str) -> None:
        await self._listening.listen(channel)

    async def _unsubscribe(self, channel: str) -> None:
        await self._listening.unlisten(channel)

    # -- helpers -----------------------------------------------------------------

    async def _open_connection(
        self, role: str, options: Mapping[str, str]
    ) -> psycopg.AsyncConnection[Any]:
        conninfo = self._listen_conninfo if role == "listener" else self._conninfo
        given = conninfo_to_dict(conninfo)
        # Settings the DSN names itself win over our defaults.
        extra = {
            key: value
            for key, value in {"application_name": f"queuert-notify {role}", **options}.items()
            if key not in given
        }
        async with asyncio.timeout(self._connect_timeout):
            conn = await psycopg.AsyncConnection.connect(
                make_conninfo(conninfo, **extra),
                autocommit=True,
                connect_timeout=max(1, round(self._connect_timeout)),
                # Never a server-side prepared statement: a pooler in front of the
                # server would lose it between statements.
                prepare_threshold=None,
            )
            if role == "listener" and await _through_a_pooler(conn):
                logger.warning(
                    "the Postgres LISTEN connection to %s goes through a connection pooler "
                    "(PgBouncer?): in transaction mode no notification arrives; pass "
                    "listen_url= the server's own address",
                    _describe(conninfo),
                    extra=self._log,
                )
            return conn

    @property
    def _log(self) -> dict[str, str]:
        return {"address": self._address, "prefix": self._prefix}


async def _through_a_pooler(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn`` reaches Postgres through a pooler: the backend process id
    announced at startup is then the pooler's own."""
    cursor = await conn.execute("SELECT pg_backend_pid()")
    row = await cursor.fetchone()
    return row is not None and row[0] != conn.info.backend_pid


def _conninfo(dsn_or_engine: object) -> str:
    """A libpq connection string for ``dsn_or_engine``; raises ConfigurationError."""
    if isinstance(dsn_or_engine, AsyncEngine | Engine):
        url = dsn_or_engine.url
        if url.get_backend_name() != "postgresql":
            raise ConfigurationError(
                "PostgresNotifyAdapter needs an engine on PostgreSQL, not "
                f"{url.get_backend_name()}; use another notify adapter for this database"
            )
        # The engine's driver (psycopg, asyncpg, ...) is irrelevant: we speak libpq.
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    elif isinstance(dsn_or_engine, str):
        dsn = dsn_or_engine
        if "://" in dsn:
            scheme, rest = dsn.split("://", 1)
            if scheme.lower().partition("+")[0] not in ("postgresql", "postgres"):
                raise ConfigurationError(
                    f"unsupported Postgres DSN scheme {scheme!r}: use postgresql:// "
                    "(or postgresql+psycopg://)"
                )
            dsn = f"postgresql://{rest}"
    else:
        raise ConfigurationError(
            "PostgresNotifyAdapter needs a DSN such as 'postgresql://user@host/db' or an "
            f"SQLAlchemy engine, not {type(dsn_or_engine).__name__}"
        )
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid Postgres DSN: {exc}") from None
    return dsn


def _describe(conninfo: str) -> str:
    """Where ``conninfo`` connects, for messages and logs (never the password)."""
    params = conninfo_to_dict(conninfo)
    user = f"{params['user']}@" if params.get("user") else ""
    host = str(params.get("host") or "localhost")
    port = f":{params['port']}" if params.get("port") else ""
    dbname = f"/{params['dbname']}" if params.get("dbname") else ""
    return f"postgresql://{user}{host}{port}{dbname}"
