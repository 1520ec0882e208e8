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
instead (:mod:`~queuert_notify.notify.redis.lists` has that layout); chain-completed
and ownership-lost stay on the channels above.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from queuert_notify.errors import ConfigurationError
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from queuert_notify.notify.protocol import (
    ConnectOnEnter,
    JobIdCallback,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)
from queuert_notify.notify.redis.lists import DEFAULT_CONSUMER_TIMEOUT, RedisWakeLists
from queuert_notify.notify.redis.server import RedisServerTransport
from queuert_notify.notify.redis.transport import (
    RedisTransport,
    RedisTransportFactory,
    RedisWakes,
)

if TYPE_CHECKING:
    from queuert_notify.notify.redis.blocking import RedisBlockingPublisher
    from queuert_notify.notify.redis.cluster_blocking import RedisClusterBlockingPublisher

logger = logging.getLogger(__name__)

_PREFIX = re.compile(r"[A-Za-z0-9_.-]+")
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

    Every method delegates to a :class:`~queuert_notify.notify.redis.transport.RedisTransport`
    chosen at construction:
    :class:`~queuert_notify.notify.redis.server.RedisServerTransport`, or, for Redis
    Cluster (``cluster=True`` with the URL of any node, or a caller-owned
    ``redis.asyncio.cluster.RedisCluster`` as ``client``), to
    :class:`~queuert_notify.notify.redis.cluster.RedisClusterTransport`
    (sharded Pub/Sub, hash-tagged keys; its docstring has the wire layout).

    ``wake="lists"`` (one server or a cluster) turns job-scheduled wakeups into durable
    tokens on Redis lists (:class:`~queuert_notify.notify.redis.lists.RedisWakeLists`): one
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
        # Chosen once; mypy checks each transport class against RedisTransportFactory.
        transport: RedisTransportFactory = RedisServerTransport
        if self._cluster:
            from queuert_notify.notify.redis.cluster import RedisClusterTransport

            transport = RedisClusterTransport
        self._transport: RedisTransport = transport(
            url,
            client=client,
            prefix=prefix,
            connect_timeout=connect_timeout,
            close_timeout=close_timeout,
        )
        self.wake: WakeMode = wake
        self._close_timeout = close_timeout
        self._lists: RedisWakeLists | None = None
        # Job-scheduled wakes (and their budgets) go to the transport, or in lists mode
        # to the token lists; mypy checks both against RedisWakes.
        self._wakes: RedisWakes = self._transport
        if wake == "lists":
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

    def blocking_publisher(self) -> RedisBlockingPublisher | RedisClusterBlockingPublisher:
        """A publisher with a blocking client on this adapter's server or cluster, wire
        layout and scripts, for ``SyncClient`` (which publishes from a thread of its own)."""
        if self._url is None:
            raise ConfigurationError(
                "SyncClient needs a RedisNotifyAdapter built with url=...: a caller's "
                "redis.asyncio client belongs to its event loop"
            )
        lists = self.wake == "lists"
        if self._cluster:
            from queuert_notify.notify.redis.cluster_blocking import (
                RedisClusterBlockingPublisher,
            )

            return RedisClusterBlockingPublisher(self._url, self.prefix, lists=lists)
        from queuert_notify.notify.redis.blocking import RedisBlockingPublisher

        return RedisBlockingPublisher(self._url, self.prefix, lists=lists)

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

    async def notify_signals(self, chain_ids: Sequence[str], job_ids: Sequence[str]) -> None:
        """Chain completions and ownership losses in one round trip (see
        :meth:`ChannelNotifyAdapter.notify_signals`)."""
        await self._transport.notify_signals(chain_ids, job_ids)

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        return await self._transport.listen_chain_completed(chain_id, callback)

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        await self._transport.notify_job_ownership_lost(job_id)

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        return await self._transport.listen_job_ownership_lost(job_id, callback)

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        return await self._transport.listen_every_job_ownership_lost(callback)

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
