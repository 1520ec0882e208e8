"""The single-server transport of ``RedisNotifyAdapter``: Pub/Sub on one server (or a
replica set behind one address), wake budgets in plain keys changed only by Lua.

Its wire layout is :mod:`~queuert_notify.notify.redis.adapter`'s (names from
:mod:`~queuert_notify.notify.redis.shared`). It owns two connections: commands
(PUBLISH, EVALSHA) and a dedicated subscriber read by one reader task, which
reconnects with the shared backoff and re-subscribes every live channel.
:meth:`RedisServerTransport.wake_lists` builds the ``wake="lists"`` token lists on
the same server, with a third, blocking connection of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from itertools import groupby
from operator import itemgetter
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from queuert_notify.errors import ConfigurationError, mask_url
from queuert_notify.notify.payloads import check_count, decode_text, encode_payload
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.redis.lists import RedisWakeLists
from queuert_notify.notify.redis.lists_lines import SOCKET_TIMEOUT, ServerPlacement
from queuert_notify.notify.redis.shared import (
    CONSUME_WAKE_HINT,
    NOTIFY_JOBS_SCHEDULED,
    PROVIDE_WAKE_HINT,
    PUBLISH_MANY,
    BudgetChannelAdapter,
    channel_name,
    connection_retry,
    hint_key,
)
from queuert_notify.notify.shared_listener import SharedListener
from state_adapters.backoff import Backoff

logger = logging.getLogger(__name__)

_SCHEMES = ("redis", "rediss", "unix")
_SCRIPTS = (PROVIDE_WAKE_HINT, CONSUME_WAKE_HINT, NOTIFY_JOBS_SCHEDULED, PUBLISH_MANY)
_READ_TIMEOUT = 1.0  # get_message wait; > 0 so an idle reader sleeps instead of spinning
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
_SUBSCRIBER_HEALTH_CHECK = 30  # seconds; PING an idle subscriber so a dead socket is noticed
# Connection settings a pool injects into its own connections; a copied pool makes its own.
_POOL_INTERNAL_KWARGS = ("himport_registry", "event_dispatcher", "redis_connect_func")


class RedisServerTransport(BudgetChannelAdapter):
    """The single-server half of ``RedisNotifyAdapter``: Pub/Sub on one server (or a
    replica set behind one address), wake budgets in plain keys. Each public method
    keeps the promise of the same method of ``RedisNotifyAdapter``.

    Built by ``RedisNotifyAdapter``, which has checked ``prefix`` and that exactly
    one of ``url`` and ``client`` is given.
    """

    _ADAPTER_NAME = "RedisNotifyAdapter"

    def __init__(
        self,
        url: str | None,
        client: object,
        *,
        prefix: str,
        connect_timeout: float,
        close_timeout: float,
    ) -> None:
        address, self._commands, subscriber_pool = (
            _clients_for_url(url) if url is not None else _clients_for_caller(client)
        )
        super().__init__(
            prefix=prefix,
            address=address,
            channel_name=channel_name,
            listener=SharedListener(self._subscribe, self._unsubscribe),
        )
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._owns_commands = url is not None
        self._subscriber = Redis.from_pool(subscriber_pool)
        self._pubsub: PubSub = self._subscriber.pubsub()
        self._provide_script = self._commands.register_script(PROVIDE_WAKE_HINT)
        self._consume_script = self._commands.register_script(CONSUME_WAKE_HINT)
        self._schedule_script = self._commands.register_script(NOTIFY_JOBS_SCHEDULED)
        self._publish_script = self._commands.register_script(PUBLISH_MANY)
        # Futures of our own SUBSCRIBE/UNSUBSCRIBE calls, resolved by the reader
        # when Redis confirms them; keyed by (confirmation kind, channel).
        self._confirmations: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lost = False  # the reader lost the subscriber connection, not yet restored

    def wake_lists(self, consumer_timeout: float) -> RedisWakeLists:
        """Lists mode on this server: the command client, plus a blocking connection of
        its own (never shared with commands or the subscriber)."""
        pool = _copy_pool(self._commands.connection_pool)
        # No silent reconnect (the command pool's retry would resend the blocking move on
        # a new connection): the lane must see the failure, to learn its new client id
        # (what its nudges unblock), count its lists again (a move whose reply was lost)
        # and run the on_reconnect callbacks.
        pool.connection_kwargs.update(socket_timeout=SOCKET_TIMEOUT, retry=Retry(NoBackoff(), 0))
        return RedisWakeLists(
            self._commands,
            ServerPlacement(self._commands, pool),
            prefix=self._prefix,
            address=self._address,
            ready=self._ready_to_send,
            consumer_timeout=consumer_timeout,
        )

    # -- lifecycle -----------------------------------------------------------

    async def connect(self) -> None:
        """Load the scripts and open the subscriber; idempotent.

        Raises ConfigurationError naming the (password-masked) address when
        Redis does not answer within ``connect_timeout``.
        """
        await self._connect_once(self._open)

    async def _open(self) -> None:
        try:
            async with asyncio.timeout(self._connect_timeout):
                for script in _SCRIPTS:
                    await self._commands.script_load(script)
                await self._pubsub.connect()  # type: ignore[no-untyped-call]
        except (RedisError, OSError, TimeoutError) as exc:
            await self._release_connections()
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise ConfigurationError(
                f"cannot reach Redis at {self._address}: {reason}; is the server running?"
            ) from exc
        self._reader = asyncio.create_task(
            self._read_loop(), name=f"queuert-notify redis reader {self._prefix}"
        )

    async def close(self) -> None:
        """Stop the reader, drop every listener, close what the adapter opened; idempotent."""
        await self._close_once(
            self._shut_down, self._close_timeout, logger, "redis notify adapter close timed out"
        )

    async def _shut_down(self) -> None:
        # The reader goes first: nothing may read from a connection being closed.
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._listener.dispose()
        for futures in self._confirmations.values():
            for future in futures:
                future.cancel()
        self._confirmations.clear()
        self._reconnect_callbacks.clear()
        await self._release_connections()

    # -- notifications -------------------------------------------------------

    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        await self._ready_to_send()
        if len(messages) == 1:
            await self._commands.publish(*messages[0])
            return
        # One round trip, one command and one reply for all (a worker's flush carries a
        # message per completed chain), an argument per run of messages on one channel.
        args: list[str] = []
        for channel, run in groupby(messages, key=itemgetter(0)):
            args += [channel, "\0".join(payload for _, payload in run)]
        await self._publish_script(keys=[], args=args)

    # -- wake hints ------------------------------------------------------------

    def _hint_key(self, type_name: str) -> str:
        return hint_key(self._prefix, type_name)

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Provide every budget, then publish every type name: one EVALSHA, one round trip.

        Types with a count of 0 are skipped (no new jobs, nothing to announce).
        """
        # Every name and count is checked before anything is sent.
        scheduled = {
            encode_payload("type name", name): count
            for name, count in counts.items()
            if check_count(count) > 0
        }
        await self._ready_to_send()
        if not scheduled:
            return
        keys = [hint_key(self._prefix, name) for name in scheduled]
        args: list[str | int] = [self._sched, HINT_TTL_SECONDS]
        for name, count in scheduled.items():
            args += [name, count]
        await self._schedule_script(keys=keys, args=args)

    # -- subscriber ------------------------------------------------------------

    async def _subscribe(self, channel: str) -> None:
        """SUBSCRIBE and wait for Redis to confirm, so no later message is missed."""
        await self._send_and_confirm("subscribe", channel, self._pubsub.subscribe)

    async def _unsubscribe(self, channel: str) -> None:
        if self._closed:
            # Closing the subscriber connection drops every subscription at once.
            return
        await self._send_and_confirm("unsubscribe", channel, self._pubsub.unsubscribe)

    async def _send_and_confirm(
        self, kind: str, channel: str, send: Callable[[str], Awaitable[object]]
    ) -> None:
        if self._lost:
            # Only the reader reconnects the subscriber. A caller's send would connect
            # it too, racing the reader's own connect on one redis-py connection (each
            # reading the other's replies; a bound cut short mid-handshake): the restore
            # could go unnoticed. Channels already subscribed are re-subscribed by the
            # reader's reconnect.
            raise RedisConnectionError(
                f"Redis at {self._address} is unreachable; the subscriber is reconnecting"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._confirmations.setdefault((kind, channel), [])
        waiting.append(future)
        try:
            await send(channel)
            async with asyncio.timeout(self._connect_timeout):
                await future
        finally:
            if future in waiting:
                waiting.remove(future)
            if not waiting:
                self._confirmations.pop((kind, channel), None)

    async def _read_loop(self) -> None:
        """Read the subscriber connection until cancelled; never dies of a bad message."""
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX)
        while True:
            try:
                message = await self._pubsub.get_message(timeout=_READ_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._lost:
                    self._lost = True
                    logger.warning(
                        "redis subscriber lost its connection; reconnecting",
                        extra={"address": self._address, "error": repr(exc)},
                    )
                    self._fire_reconnect()
                # Jittered exponential backoff: no hot loop while Redis is down.
                await backoff.sleep()
                continue
            if self._lost:
                self._lost = False
                backoff.reset()
                logger.info("redis subscriber reconnected", extra={"address": self._address})
                if message is None or not self._handle(message):
                    # Restored, whatever message came first: poll now.
                    self._fire_reconnect()
            elif message is not None:
                self._handle(message)

    def _handle(self, message: dict[str, Any]) -> bool:
        """Deliver or confirm ``message``; True when it showed a reconnect and the
        ``on_reconnect`` callbacks ran."""
        kind = message.get("type")
        channel = decode_text(message.get("channel"))
        if channel is None:
            return False
        if kind == "message":
            self._deliver(channel, message.get("data"))
        elif kind in ("subscribe", "unsubscribe"):
            waiting = self._confirmations.get((kind, channel))
            pending = [future for future in waiting or () if not future.done()]
            if pending:
                pending[0].set_result(None)
            elif kind == "subscribe" and message.get("data") == 1:
                # Unrequested and first on its connection: Redis-py re-subscribed
                # after a reconnect; anything published meanwhile was missed.
                logger.info("redis subscriptions restored", extra={"address": self._address})
                self._fire_reconnect()
                return True
        return False

    # -- helpers -----------------------------------------------------------------

    async def _ready_to_send(self) -> None:
        """Connected, and the subscriber not reconnecting."""
        await self._ready()
        if self._lost:
            # Fail at once instead of each call waiting out its own reconnect attempts:
            # during an outage that would cost every job the retry delays.
            raise RedisConnectionError(
                f"Redis at {self._address} is unreachable; the subscriber is reconnecting"
            )

    async def _release_connections(self) -> None:
        """Close the subscriber (always ours) and the command client only if ours."""
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._subscriber.aclose()
        if self._owns_commands:
            await self._commands.aclose()


def _clients_for_url(url: str) -> tuple[str, Redis, ConnectionPool]:
    """The (password-masked) address of ``url``, the command client and the subscriber
    pool the adapter opens (and closes) itself."""
    address = mask_url(url)
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL {address!r}: the scheme must be redis://, rediss:// or unix://"
        )
    try:
        commands = Redis.from_url(url, retry=connection_retry())
        subscriber_pool = ConnectionPool.from_url(
            url, retry=connection_retry(), health_check_interval=_SUBSCRIBER_HEALTH_CHECK
        )
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {address!r}: {exc}") from exc
    return address, commands, subscriber_pool


def _clients_for_caller(client: object) -> tuple[str, Redis, ConnectionPool]:
    """A caller-owned client's address, the client itself (never closed by the adapter)
    and a subscriber pool of the adapter's own reaching the same server."""
    if not isinstance(client, Redis):
        raise ConfigurationError(
            f"client must be a redis.asyncio.Redis (or, for Redis Cluster, a "
            f"redis.asyncio.cluster.RedisCluster), not {type(client).__name__}"
        )
    return _describe_pool(client.connection_pool), client, _copy_pool(client.connection_pool)


def _copy_pool(pool: ConnectionPool) -> ConnectionPool:
    """A new pool reaching the same server as ``pool`` with the same credentials and
    TLS settings, returning raw bytes (payloads are decoded and checked here)."""
    kwargs = {
        key: value
        for key, value in pool.connection_kwargs.items()
        if key not in _POOL_INTERNAL_KWARGS and "maint" not in key and not key.startswith("orig_")
    }
    kwargs.update(decode_responses=False, health_check_interval=_SUBSCRIBER_HEALTH_CHECK)
    return ConnectionPool(connection_class=pool.connection_class, **kwargs)


def _describe_pool(pool: ConnectionPool) -> str:
    """Where ``pool`` connects, for error messages (never the password)."""
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}"
