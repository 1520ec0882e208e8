"""The Redis Cluster half of ``RedisNotifyAdapter(cluster=True)``: sharded Pub/Sub and
hash-tagged wake budgets.

Cluster wire layout (``prefix`` defaults to ``queuert``; ``{...}`` are literal
braces, a Redis hash tag):

==========================  ==================================  ==============
what                        name                                payload/value
==========================  ==================================  ==============
jobs became pending         shard channel ``P:sched:{<type>}``  the type name
chain completed             shard channel ``P:chainc:{<id>}``   the chain id
ownership lost              shard channel ``P:owls:{<id>}``     the job id
wake budget                 key ``P:hint:{<type>}``             integer, 60 s
==========================  ==================================  ==============

A type's budget key and its wake channel carry the same hash tag, so they live
in one slot on one master: the fused "provide budgets, then announce" script
runs there and its SPUBLISH reaches that slot's subscribers. Every channel is
named after the one type, chain or job it is about, so a message is sent to
one master and delivered only to the subscribers of that name: nothing is
broadcast to every node or every listener. A name that is empty or contains
``}`` (which would end the hash tag early) is tagged by a digest instead:
``P:hint:{#<hex>}:<type>``.

With ``wake="lists"`` job-scheduled wakeups are tokens on lists named as in
:mod:`~queuert_notify.notify.redis.lists`, with the same hash tag standing for the
type (``P:wake:{<type>}``, ``P:wake:{<type>}:proc:<consumer>``, ...): every key of
one type in one slot. Chain-completed and ownership-lost stay on the shard channels.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from queuert_notify.errors import ConfigurationError, mask_url
from queuert_notify.notify.payloads import scheduled_counts
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.redis.lists import RedisWakeLists
from queuert_notify.notify.redis.lists_lines import ClusterPlacement
from queuert_notify.notify.redis.sharded_subscriber import ShardedSubscriber
from queuert_notify.notify.redis.shared import (
    CONSUME_WAKE_HINT,
    PROVIDE_WAKE_HINT,
    BudgetChannelAdapter,
    ScriptCall,
    all_at_once,
    connection_retry,
    hash_tag,
    lua_script,
)
from queuert_notify.notify.shared_listener import SharedListener

logger = logging.getLogger(__name__)

NOTIFY_JOBS_SCHEDULED_SHARDED = lua_script("notify_jobs_scheduled_sharded")
_SCHEMES = ("redis", "rediss")


def cluster_name(prefix: str, kind: str, value: str) -> str:
    """The key or shard channel of ``kind`` (``sched``, ``chainc``, ``owls``, ``hint``)
    for one type, chain or job: hash-tagged by ``value`` so every name of one value
    shares a slot."""
    return _kind_prefix(prefix, kind) + hash_tag(value)


def _kind_prefix(prefix: str, kind: str) -> str:
    """What every name of ``kind`` starts with."""
    return f"{prefix}:{kind}:"


def cluster_hint_key(prefix: str, type_name: str) -> str:
    """The key holding the wake budget of ``type_name``; same slot as its wake channel."""
    return cluster_name(prefix, "hint", type_name)


def scheduled_by_slot(prefix: str, counts: Mapping[str, int]) -> list[ScriptCall]:
    """The calls of ``notify_jobs_scheduled_sharded.lua`` that provide every type's
    budget and announce it on its shard channel: one per hash slot involved (none for
    no count above 0). Every name and count is checked first (``InvalidInputError``)."""
    by_slot: dict[int, ScriptCall] = {}
    for type_name, count in scheduled_counts(counts).items():
        key = cluster_hint_key(prefix, type_name)
        keys, args = by_slot.setdefault(key_slot(key.encode()), ([], [HINT_TTL_SECONDS]))
        keys.append(key)
        args += [cluster_name(prefix, "sched", type_name), type_name, count]
    return list(by_slot.values())


class RedisClusterTransport(BudgetChannelAdapter):
    """Notifications over sharded Pub/Sub (SPUBLISH/SSUBSCRIBE) on a Redis Cluster; wake
    budgets in hash-tagged keys, changed only by Lua. Each public method keeps the
    promise of the same method of :class:`~queuert_notify.notify.protocol.NotifyAdapter`.

    Built by ``RedisNotifyAdapter`` (which has checked ``prefix`` and that exactly
    one of ``url`` and ``client`` is given). Guarantees beyond the protocol:

    - Pass ``url`` (``redis://`` or ``rediss://`` of any one node) or a
      caller-owned ``redis.asyncio.cluster.RedisCluster``; ``close()`` closes
      only what the transport opened.
    - Commands go through the cluster client (routed by slot); subscriptions
      use connections of their own, one per master that owns a subscribed
      channel's slot (:class:`ShardedSubscriber`).
    - ``notify_jobs_scheduled`` runs one script per hash slot involved, all
      sent at once: one round trip of wall time, however many masters.
    - When a slot moves or a master fails over, subscriptions follow it and
      ``on_reconnect`` callbacks run (once when the loss is noticed, once when
      every channel is subscribed again).
    """

    _ADAPTER_NAME = "RedisNotifyAdapter"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: object = None,
        prefix: str,
        connect_timeout: float = 5.0,
        close_timeout: float = 5.0,
    ) -> None:
        if url is not None:
            address = mask_url(url)
            self._commands = _cluster_for_url(url, address)
        elif isinstance(client, RedisCluster):
            address = _describe_cluster(client)
            self._commands = client
        else:
            raise ConfigurationError(
                "RedisNotifyAdapter(cluster=True) needs url='redis://<any node>:6379' or "
                f"client=<redis.asyncio.cluster.RedisCluster>, not {type(client).__name__}"
            )
        self._owns_commands = url is not None
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._provide_script = self._commands.register_script(PROVIDE_WAKE_HINT)
        self._consume_script = self._commands.register_script(CONSUME_WAKE_HINT)
        self._schedule_script = self._commands.register_script(NOTIFY_JOBS_SCHEDULED_SHARDED)
        self._subscriber = ShardedSubscriber(
            self._commands,
            self._deliver,
            self._fire_reconnect,
            confirm_timeout=connect_timeout,
        )
        super().__init__(
            prefix=prefix,
            address=address,
            channel_name=_kind_prefix,
            listener=SharedListener(self._subscriber.subscribe, self._subscriber.unsubscribe),
        )

    def wake_lists(self, consumer_timeout: float) -> RedisWakeLists:
        """Lists mode on this cluster: keys hash-tagged per type, commands through the
        cluster client, one blocking connection per slot holding listened types."""
        return RedisWakeLists(
            self._commands,
            ClusterPlacement(self._commands),
            prefix=self._prefix,
            address=self._address,
            ready=self._ready,
            consumer_timeout=consumer_timeout,
        )

    @property
    def subscriber_nodes(self) -> list[str]:
        """``host:port`` of every master a subscriber connection is open to."""
        return self._subscriber.nodes

    # -- lifecycle -----------------------------------------------------------

    async def connect(self) -> None:
        """Discover the cluster, load the scripts on every master, start the subscriber;
        idempotent. Raises ConfigurationError naming the address when no node answers
        within ``connect_timeout``."""
        await self._connect_once(self._open)

    async def _open(self) -> None:
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._commands.initialize()
                for script in (
                    PROVIDE_WAKE_HINT,
                    CONSUME_WAKE_HINT,
                    NOTIFY_JOBS_SCHEDULED_SHARDED,
                ):
                    await self._commands.script_load(script)
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            if self._owns_commands:
                await self._commands.aclose()
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise ConfigurationError(
                f"cannot reach the Redis Cluster at {self._address}: {reason}; "
                "is every node running and the cluster state ok?"
            ) from exc
        self._subscriber.start()

    async def close(self) -> None:
        """Drop every listener, stop the subscriber, close what the transport opened.
        The subscriber gets ``close_timeout``; the cluster client the transport opened
        is closed even when that ran out (its connections close locally, without an
        answer from any node)."""
        try:
            await self._close_once(
                self._shut_down,
                self._close_timeout,
                logger,
                "redis cluster notify adapter close timed out",
            )
        finally:
            # Not under the timeout: a subscription stuck on a hanging master must not
            # leave every node's connection open until the garbage collector finds it.
            # (Idempotent: a closed RedisCluster's aclose does nothing.)
            if self._owns_commands:
                await self._commands.aclose()

    async def _shut_down(self) -> None:
        self._reconnect_callbacks.clear()
        # Closing every subscriber connection drops every subscription at once;
        # the listener's unsubscribes then find nothing left to send.
        await self._subscriber.close()
        await self._listener.dispose()

    # -- wake hints ------------------------------------------------------------

    def _hint_key(self, type_name: str) -> str:
        return cluster_hint_key(self._prefix, type_name)

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Provide every budget, then announce every type: one script per hash slot,
        all sent at once. Types with a count of 0 are skipped."""
        calls = scheduled_by_slot(self._prefix, counts)
        await self._ready()
        await all_at_once([self._schedule_script(keys=keys, args=args) for keys, args in calls])

    # -- delivery --------------------------------------------------------------

    def _channel(self, base: str, value: str) -> str:
        """A channel per type, chain or job, hash-tagged by ``value`` (see :func:`cluster_name`)."""
        return base + hash_tag(value)

    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        await self._ready()
        for channel, payload in messages:
            await self._commands.spublish(channel, payload)


def _cluster_for_url(url: str, address: str) -> RedisCluster:
    """The cluster client the transport opens (and closes) itself."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis Cluster URL {address!r}: the scheme must be redis:// or "
            "rediss:// (a cluster has no unix:// sockets)"
        )
    try:
        return RedisCluster.from_url(url, retry=connection_retry())
    except (ValueError, RedisError, RedisClusterException) as exc:
        raise ConfigurationError(f"invalid Redis Cluster URL {address!r}: {exc}") from exc


def _describe_cluster(client: RedisCluster) -> str:
    """The startup nodes of ``client``, for error messages (never the password)."""
    nodes: Any = client.nodes_manager.startup_nodes
    return ", ".join(f"redis://{name}" for name in nodes) or "an unnamed cluster"
