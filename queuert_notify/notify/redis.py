"""Redis Pub/Sub notifications with atomic wake budgets kept by Lua scripts.

Wire layout (``prefix`` defaults to ``queuert``):

====================  ==========================  ===========================
what                  name                        payload / value
====================  ==========================  ===========================
jobs became pending   channel ``{prefix}:sched``  the type name
chain completed       channel ``{prefix}:chainc`` the chain id
ownership lost        channel ``{prefix}:owls``   the job id
wake budget           key ``{prefix}:hint:{t}``   integer, TTL 60 s
====================  ==========================  ===========================

With ``wake="lists"`` jobs-scheduled wakeups and budgets are durable tokens on lists
instead (:mod:`~queuert_notify.notify.redis_lists` has that layout); chain-completed
and ownership-lost stay on the channels above.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from queuert_notify.errors import ConfigurationError
from queuert_notify.notify.channel_adapter import ChannelNotifyAdapter
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from queuert_notify.notify.payloads import (
    check_count,
    decode_text,
    encode_payload,
)
from queuert_notify.notify.protocol import (
    HINT_TTL_SECONDS,
    ConnectOnEnter,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)
from queuert_notify.notify.redis_connections import (
    clients_for_caller,
    clients_for_url,
    copy_pool,
)
from queuert_notify.notify.redis_lists import (
    BLOCK_TIMEOUT,
    DEFAULT_CONSUMER_TIMEOUT,
    RedisWakeLists,
)
from queuert_notify.notify.redis_shared import (
    CONSUME_WAKE_HINT,
    NOTIFY_JOBS_SCHEDULED,
    PROVIDE_WAKE_HINT,
    channel_name,
    hint_key,
)
from queuert_notify.notify.shared_listener import SharedListener
from state_adapters.backoff import Backoff

if TYPE_CHECKING:
    from queuert_notify.notify.redis_blocking import RedisBlockingPublisher
    from queuert_notify.notify.redis_cluster import RedisClusterTransport

logger = logging.getLogger(__name__)

_PREFIX = re.compile(r"[A-Za-z0-9_.-]+")
_READ_TIMEOUT = 1.0  # get_message wait; > 0 so an idle reader sleeps instead of spinning
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
WakeMode = Literal["pubsub", "lists"]


class RedisNotifyAdapter(ConnectOnEnter):
    """Notifications over Redis Pub/Sub; wake budgets in Redis keys, changed only by Lua.

    Guarantees:

    - Pass ``url`` (``redis://``, ``rediss://`` or ``unix://``) or a
      caller-owned ``redis.asyncio.Redis`` ``client``; ``close()`` closes only
      what the adapter opened, never the caller's client.
    - Two connections: commands (PUBLISH, EVALSHA) and a dedicated subscriber
      from a pool of the adapter's own, so command traffic never starves it.
    - A listener registered by an awaited ``listen_*`` call hears every later
      notification: the call returns after Redis confirmed the SUBSCRIBE.
    - Wake budgets change atomically (Lua run by EVALSHA; a flushed or
      restarted server gets the scripts again, transparently).
      ``notify_jobs_scheduled`` is one round trip.
    - Payloads that are empty, longer than :data:`MAX_PAYLOAD_BYTES`, not
      UTF-8 or holding NUL are dropped and counted in :attr:`ignored_messages`
      (:mod:`~queuert_notify.notify.payloads`); nothing a stranger publishes
      can stop the subscriber.
    - When the subscriber connection drops, it reconnects with backoff,
      Redis re-subscribes every live channel, and ``on_reconnect`` callbacks
      run (once when the loss is noticed, once when the subscription is back).
    - ``close()`` is idempotent, bounded by ``close_timeout``, and leaves no
      task running; afterwards calls raise ``NotifyAdapterClosedError``.

    While Redis is unreachable, ``notify_*``, hint and ``listen_*`` calls raise
    ``redis.exceptions.ConnectionError`` (``notify_*`` and hint calls at once,
    without connection attempts, while the subscriber knows the connection is
    lost): notifications are hints, so callers log and rely on polling.

    Every method delegates to :class:`RedisServerTransport`, or, for Redis
    Cluster (``cluster=True`` with the URL of any node, or a caller-owned
    ``redis.asyncio.cluster.RedisCluster`` as ``client``), to
    :class:`~queuert_notify.notify.redis_cluster.RedisClusterTransport`
    (sharded Pub/Sub, hash-tagged keys; its docstring has the wire layout).

    ``wake="lists"`` (single server) turns job-scheduled wakeups into durable tokens
    on Redis lists (:class:`~queuert_notify.notify.redis_lists.RedisWakeLists`): one
    token wakes one listening worker, a worker killed holding one gives it back within
    ``consumer_timeout`` seconds, and ``acknowledge_wakes`` removes it after the claim.
    Every producer and worker of a prefix must use the same mode.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Redis | RedisCluster | None = None,
        prefix: str = "queuert",
        cluster: bool = False,
        wake: WakeMode = "pubsub",
        connect_timeout: float = 5.0,
        close_timeout: float = 5.0,
        consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT,
    ) -> None:
        if wake not in ("pubsub", "lists"):
            raise ConfigurationError(
                f"RedisNotifyAdapter(wake={wake!r}) is not a wake mode: use 'pubsub' "
                "(Pub/Sub + wake-hint budget) or 'lists' (durable tokens on Redis lists)"
            )
        if not (isinstance(consumer_timeout, int | float) and consumer_timeout > 0):
            raise ConfigurationError(
                f"consumer_timeout must be a positive number of seconds, got {consumer_timeout!r}"
            )
        if wake == "lists" and (cluster or isinstance(client, RedisCluster)):
            raise ConfigurationError(
                "RedisNotifyAdapter(wake='lists') runs on a single Redis server (or a "
                "replica set behind one address), not yet on Redis Cluster: use "
                "wake='pubsub' with cluster=True"
            )
        if (url is None) == (client is None):
            raise ConfigurationError(
                "RedisNotifyAdapter needs exactly one of url='redis://host:6379/0' "
                "or client=<redis.asyncio.Redis>"
            )
        if not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"Redis prefix {prefix!r} is not allowed: use letters, digits, '_', '.' or '-'"
            )
        self._url = url
        self._cluster = cluster or isinstance(client, RedisCluster)
        transport: type[RedisServerTransport | RedisClusterTransport] = RedisServerTransport
        if self._cluster:
            from queuert_notify.notify.redis_cluster import RedisClusterTransport

            transport = RedisClusterTransport
        self._transport = transport(
            url,
            client=client,
            prefix=prefix,
            connect_timeout=connect_timeout,
            close_timeout=close_timeout,
        )
        self.wake: WakeMode = wake
        self._close_timeout = close_timeout
        self._lists: RedisWakeLists | None = None
        self._wakes: RedisServerTransport | RedisClusterTransport | RedisWakeLists = self._transport
        if wake == "lists" and isinstance(self._transport, RedisServerTransport):
            self._lists = self._transport.wake_lists(consumer_timeout)
            self._wakes = self._lists

    @property
    def ignored_messages(self) -> int:
        """How many messages on our channels were dropped as malformed (empty,
        oversized, not UTF-8, holding NUL) since the adapter was created."""
        return self._transport.ignored_messages

    @property
    def prefix(self) -> str:
        """The prefix of every channel and key this adapter uses."""
        return self._transport.prefix

    def blocking_publisher(self) -> RedisBlockingPublisher:
        """A publisher with a blocking client on this adapter's server, wire layout
        and scripts, for ``SyncClient`` (which publishes from a thread of its own)."""
        from queuert_notify.notify.redis_blocking import RedisBlockingPublisher

        if self._cluster:
            raise ConfigurationError(
                "SyncClient cannot publish to Redis Cluster yet: use a single Redis server, "
                "PostgresNotifyAdapter, or notify=None (workers poll)"
            )
        if self._url is None:
            raise ConfigurationError(
                "SyncClient needs a RedisNotifyAdapter built with url=...: a caller's "
                "redis.asyncio client belongs to its event loop"
            )
        return RedisBlockingPublisher(self._url, self.prefix, lists=self.wake == "lists")

    async def connect(self) -> None:
        """Load the scripts and open the subscriber; idempotent.

        Raises ConfigurationError naming the (password-masked) address when
        Redis does not answer within ``connect_timeout``.
        """
        await self._transport.connect()

    async def close(self) -> None:
        """Stop the reader, drop every listener, close what the adapter opened; idempotent.
        In lists mode the tokens this consumer holds go back to their lists first."""
        if self._lists is not None:
            try:
                async with asyncio.timeout(self._close_timeout):
                    await self._lists.close()
            except TimeoutError:
                logger.warning("redis wake lists close timed out", extra={"prefix": self.prefix})
        await self._transport.close()

    async def notify_job_scheduled(self, type_name: str) -> None:
        await self._wakes.notify_job_scheduled(type_name)

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        return await self._wakes.listen_job_scheduled(type_names, callback)

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None:
        """Lists mode: remove the tokens consumed since the last call from the processing
        lists (the claim they woke is done) and move no more tokens for ``callback``'s
        listener than ``free_slots``. Pub/Sub: nothing to do."""
        await self._wakes.acknowledge_wakes(callback, free_slots)

    async def notify_chain_completed(self, chain_id: str) -> None:
        await self._transport.notify_chain_completed(chain_id)

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        return await self._transport.listen_chain_completed(chain_id, callback)

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        await self._transport.notify_job_ownership_lost(job_id)

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        return await self._transport.listen_job_ownership_lost(job_id, callback)

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Run ``callback`` whenever the subscription (or, in lists mode, the blocking
        connection) was lost or restored: poll now."""
        unsubscribe = self._transport.on_reconnect(callback)
        if self._lists is None:
            return unsubscribe
        unsubscribe_lists = self._lists.on_reconnect(callback)

        async def unsubscribe_both() -> None:
            await unsubscribe()
            await unsubscribe_lists()

        return unsubscribe_both

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the budget (INCRBY + EXPIRE 60 s, atomically; lists mode:
        push ``count`` tokens); 0 is a no-op."""
        await self._wakes.provide_wake_hint(type_name, count)

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Take one unit (lists mode: a token); True when taken or when no budget exists
        (none issued in the last 60 s), False when exhausted."""
        return await self._wakes.consume_wake_hint(type_name)

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Provide every budget, then publish every type name: one round trip (one
        script per hash slot, all sent at once, on a cluster; lists mode: one script
        pushing every type's tokens, nothing published). Types with a count of 0 are
        skipped."""
        await self._wakes.notify_jobs_scheduled(counts)


class RedisServerTransport(ChannelNotifyAdapter):
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
            clients_for_url(url) if url is not None else clients_for_caller(client)
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
        # Futures of our own SUBSCRIBE/UNSUBSCRIBE calls, resolved by the reader
        # when Redis confirms them; keyed by (confirmation kind, channel).
        self._confirmations: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lost = False  # the reader lost the subscriber connection, not yet restored

    def wake_lists(self, consumer_timeout: float) -> RedisWakeLists:
        """Lists mode on this server: the command client, plus a blocking client of its
        own (one connection, never shared with commands or the subscriber)."""
        pool = copy_pool(self._commands.connection_pool)
        # A blocking move waits BLOCK_TIMEOUT on the server; the socket must wait longer.
        pool.connection_kwargs.update(socket_timeout=BLOCK_TIMEOUT + 5.0)
        return RedisWakeLists(
            self._commands,
            # One connection: its client id is what CLIENT UNBLOCK interrupts.
            Redis(connection_pool=pool, single_connection_client=True),
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
        self._check_open()
        async with self._connect_lock:
            if self._connected:
                return
            self._check_open()
            try:
                async with asyncio.timeout(self._connect_timeout):
                    for script in (PROVIDE_WAKE_HINT, CONSUME_WAKE_HINT, NOTIFY_JOBS_SCHEDULED):
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
            self._connected = True

    async def close(self) -> None:
        """Stop the reader, drop every listener, close what the adapter opened; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(self._close_timeout):
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
        except TimeoutError:
            logger.warning(
                "redis notify adapter close timed out",
                extra={"address": self._address, "timeout": self._close_timeout},
            )

    # -- notifications -------------------------------------------------------

    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        await self._ready_to_send()
        for channel, payload in messages:
            await self._commands.publish(channel, payload)

    # -- wake hints ------------------------------------------------------------

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the budget (INCRBY + EXPIRE 60 s, atomically); 0 is a no-op."""
        check_count(count)
        key = hint_key(self._prefix, encode_payload("type name", type_name))
        await self._ready_to_send()
        if count == 0:
            # INCRBY 0 would create an exhausted budget and hold consumers back.
            return
        await self._provide_script(keys=[key], args=[count, HINT_TTL_SECONDS])

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Take one unit; True when taken or when no budget exists, False when exhausted."""
        key = hint_key(self._prefix, encode_payload("type name", type_name))
        await self._ready_to_send()
        taken = await self._consume_script(keys=[key], args=[HINT_TTL_SECONDS])
        return bool(taken)

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
            if message is not None:
                self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = decode_text(message.get("channel"))
        if channel is None:
            return
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

    # -- helpers -----------------------------------------------------------------

    async def _ready_to_send(self) -> None:
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
