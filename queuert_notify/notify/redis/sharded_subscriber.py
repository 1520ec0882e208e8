"""Sharded Pub/Sub on a Redis Cluster: one subscriber connection per node that owns a
subscribed channel's slot, each with its own reader task.

redis-py's ``ClusterPubSub`` reads its per-node connections in turn from one
caller, so a message waits for the other nodes' read timeouts; here every node
connection has a reader of its own and a message is handed over as soon as it
arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError

from state_adapters.backoff import Backoff

logger = logging.getLogger(__name__)

_READ_TIMEOUT = 1.0  # get_message wait; > 0 so an idle reader sleeps instead of spinning
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
_TOPOLOGY_CHECK = 30.0  # seconds between slot-map checks while nothing else asks for one
_HEALTH_CHECK = 30  # seconds; PING an idle subscriber so a dead socket is noticed
# Connection settings a cluster node carries for its own pool; ours makes its own.
_NODE_INTERNAL_KWARGS = (
    "himport_registry",
    "event_dispatcher",
    "redis_connect_func",
    "response_callbacks",
    "retry",
    "health_check_interval",
    "decode_responses",
    "protocol",  # RESP2: subscription replies and messages arrive as plain arrays
)

MessageCallback = Callable[[str, object], None]
"""Called with a shard channel's name and a message's raw data."""


class ShardedSubscriber:
    """Keeps every wanted shard channel subscribed on the master that owns its slot.

    Invariants:

    - A channel is SSUBSCRIBEd on exactly one node connection, the one of the
      master serving its slot in the latest slot map; ``subscribe`` returns
      once that node confirmed, so every later SPUBLISH is heard.
    - A node connection exists only while it carries at least one channel, and
      has one reader task of its own; a message is delivered as soon as its
      node's reader receives it.
    - When a node connection fails (node killed, failover), a node drops a
      channel (its slot moved away: Redis sends an unrequested SUNSUBSCRIBE)
      or a periodic check finds the slot map changed, the slot map is
      refreshed and the affected channels are subscribed where their slots
      now live, retried with backoff until it succeeds. ``on_reconnect`` runs
      once when such a loss is noticed and once when every channel is back.
    - Placement changes serialize on one ``asyncio.Lock``; ``close()`` cancels
      every task and closes every connection this object opened.
    """

    def __init__(
        self,
        cluster: RedisCluster,
        on_message: MessageCallback,
        on_reconnect: Callable[[], None],
        *,
        confirm_timeout: float,
    ) -> None:
        self._cluster = cluster
        self._on_message = on_message
        self._on_reconnect = on_reconnect
        self._confirm_timeout = confirm_timeout
        self._lock = asyncio.Lock()
        self._wanted: set[str] = set()
        self._placed: dict[str, _NodeSubscriber] = {}  # channel -> node connection carrying it
        self._nodes: dict[str, _NodeSubscriber] = {}  # node name -> its connection
        # Futures of SSUBSCRIBEs sent and not yet confirmed, by channel.
        self._confirmations: dict[str, asyncio.Future[None]] = {}
        self._dirty = asyncio.Event()  # some wanted channel is not placed, or the map is stale
        self._refresh = False  # the next reconcile pass reloads the slot map first
        self._lost = False  # a loss was reported and the matching "restored" is still due
        self._reconciler: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # failed node connections being closed
        self._closed = False

    @property
    def nodes(self) -> list[str]:
        """Names (``host:port``) of the nodes a subscriber connection is open to."""
        return list(self._nodes)

    def start(self) -> None:
        """Start the task that re-places channels after losses; idempotent."""
        if self._reconciler is None:
            self._reconciler = asyncio.create_task(
                self._reconcile_loop(), name="queuert-notify redis cluster reconciler"
            )

    async def close(self) -> None:
        """Cancel every task, close every node connection; idempotent."""
        self._closed = True
        if self._reconciler is not None:
            self._reconciler.cancel()
            await asyncio.gather(self._reconciler, return_exceptions=True)
            self._reconciler = None
        async with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
            self._placed.clear()
            self._wanted.clear()
            for future in self._confirmations.values():
                future.cancel()
            self._confirmations.clear()
        await asyncio.gather(*(node.close() for node in nodes), return_exceptions=True)
        while self._closing:  # a reader may have failed while we closed the others
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def subscribe(self, channel: str) -> None:
        """SSUBSCRIBE ``channel`` on the master owning its slot and wait for the confirmation."""
        async with self._lock:
            self._wanted.add(channel)
            try:
                confirmed = await self._place(channel)
            except BaseException:
                self._wanted.discard(channel)
                await self._unplace(channel)
                raise
        try:
            # Shielded: the future is shared with the reconciler, which may re-place
            # the channel (and so resolve it) if the node fails meanwhile.
            async with asyncio.timeout(self._confirm_timeout):
                await asyncio.shield(confirmed)
        except BaseException:
            async with self._lock:
                self._wanted.discard(channel)
                await self._unplace(channel, send=True)
            raise

    async def unsubscribe(self, channel: str) -> None:
        """Stop delivering ``channel``; the node connection closes with its last channel."""
        async with self._lock:
            self._wanted.discard(channel)
            await self._unplace(channel, send=True)

    # -- placement (under self._lock) --------------------------------------------

    async def _place(self, channel: str) -> asyncio.Future[None]:
        """Make sure ``channel`` is SSUBSCRIBEd on the owner of its slot; the future
        resolves once that node confirmed (at once when it already had)."""
        owner = self._owner(channel)
        current = self._placed.get(channel)
        future = self._confirmations.get(channel)
        if current is not None and current.name == owner.name:
            if future is None:
                future = asyncio.get_running_loop().create_future()
                future.set_result(None)
            return future
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._confirmations[channel] = future
        if current is not None:
            # The slot moved: the old node already dropped the channel (or is gone).
            await self._detach(channel)
        node = self._nodes.get(owner.name)
        if node is None:
            node = _NodeSubscriber(owner, self)
            await node.open()
            self._nodes[owner.name] = node
        self._placed[channel] = node
        node.channels.add(channel)
        try:
            await node.send("SSUBSCRIBE", channel)
        except Exception as exc:
            self._node_failed(node, exc)
            raise
        return future

    async def _unplace(self, channel: str, *, send: bool = False) -> None:
        """Stop waiting for ``channel`` and forget where it lives; SUNSUBSCRIBE it there
        when ``send`` (a node connection left without channels is closed instead)."""
        future = self._confirmations.pop(channel, None)
        if future is not None and not future.done():
            future.cancel()
        node = await self._detach(channel)
        if node is not None and send:
            try:
                node.unsubscribing[channel] += 1
                await node.send("SUNSUBSCRIBE", channel)
            except Exception as exc:
                self._node_failed(node, exc)

    async def _detach(self, channel: str) -> _NodeSubscriber | None:
        """Remove ``channel`` from its node connection; close the connection when it
        carried nothing else (closing drops the subscription with it). Returns the
        node connection when it stays open."""
        node = self._placed.pop(channel, None)
        if node is None:
            return None
        node.channels.discard(channel)
        if node.channels:
            return node
        if self._nodes.get(node.name) is node:
            del self._nodes[node.name]
        await node.close()
        return None

    async def _place_all(self) -> list[asyncio.Future[None]]:
        """Place every wanted channel where the slot map says it lives."""
        futures = []
        for channel in sorted(self._wanted):
            futures.append(await self._place(channel))
        return futures

    # -- events from node readers --------------------------------------------------

    def _confirmed(self, node: _NodeSubscriber, channel: str) -> None:
        if self._placed.get(channel) is not node:
            return  # a confirmation from a connection the channel has left since
        future = self._confirmations.pop(channel, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _unsubscribed(self, node: _NodeSubscriber, channel: str) -> None:
        if node.unsubscribing[channel] > 0:
            node.unsubscribing[channel] -= 1  # the confirmation of our own SUNSUBSCRIBE
            if not node.unsubscribing[channel]:
                del node.unsubscribing[channel]
            return
        if self._placed.get(channel) is not node:
            return
        # Unrequested: the node no longer serves the slot (resharding, or a failover
        # made it a replica). Resubscribe where the slot lives now.
        logger.info(
            "redis cluster node dropped a shard channel; following its slot",
            extra={"node": node.name, "channel": channel},
        )
        self._forget(node, [channel])
        self._report_loss()

    def _slot_moved(self, node: _NodeSubscriber, slot: int) -> None:
        """The node refused an SSUBSCRIBE with MOVED/ASK: our slot map is stale. Those
        channels were never subscribed there; place them again after a refresh."""
        refused = [channel for channel in node.channels if key_slot(channel.encode()) == slot]
        logger.info(
            "redis cluster node refused a shard channel; refreshing the slot map",
            extra={"node": node.name, "slot": slot, "channels": len(refused)},
        )
        self._forget(node, refused)
        self._refresh = True
        self._dirty.set()

    def _forget(self, node: _NodeSubscriber, channels: list[str]) -> None:
        """Drop ``channels`` from ``node`` (from a reader: no await); a node connection
        left without channels is closed."""
        for channel in channels:
            if self._placed.get(channel) is node:
                del self._placed[channel]
            node.channels.discard(channel)
        if not node.channels and self._nodes.get(node.name) is node:
            del self._nodes[node.name]
            self._close_in_background(node)

    def _close_in_background(self, node: _NodeSubscriber) -> None:
        # A task of its own: this may run inside the node's reader task.
        task = asyncio.create_task(node.close(), name=f"queuert-notify close {node.name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _node_failed(self, node: _NodeSubscriber, exc: BaseException) -> None:
        """A node connection failed (or replied with an error): drop it and re-place
        its channels once the slot map is refreshed."""
        if self._nodes.get(node.name) is not node:
            return
        logger.warning(
            "redis cluster subscriber connection lost; following the slot map",
            extra={"node": node.name, "error": repr(exc), "channels": len(node.channels)},
        )
        self._forget(node, list(node.channels))
        self._report_loss()

    def _report_loss(self) -> None:
        self._refresh = True
        self._dirty.set()
        if not self._lost and not self._closed:
            self._lost = True
            self._on_reconnect()

    # -- reconciliation ------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        """Until cancelled: after every loss (and every ``_TOPOLOGY_CHECK`` seconds),
        refresh the slot map and place every wanted channel where it now lives."""
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX)
        while True:
            try:
                async with asyncio.timeout(_TOPOLOGY_CHECK):
                    await self._dirty.wait()
            except TimeoutError:
                if not self._wanted:
                    continue
                self._refresh = True
            self._dirty.clear()
            try:
                if self._refresh:
                    self._refresh = False
                    await self._cluster.nodes_manager.initialize()
                async with self._lock:
                    # Subscribed, but no longer where the slot lives: nobody told us.
                    moved = [c for c in self._placed if not self._in_place(c)]
                    futures = await self._place_all()
                if futures:
                    # asyncio.wait: a future cancelled by a concurrent unsubscribe is done.
                    _, unconfirmed = await asyncio.wait(futures, timeout=self._confirm_timeout)
                    if unconfirmed:
                        raise TimeoutError(f"{len(unconfirmed)} SSUBSCRIBE(s) not confirmed")
            except Exception as exc:
                logger.info(
                    "redis cluster subscriptions not restored yet; retrying",
                    extra={"error": repr(exc), "retry_in": backoff.step},
                )
                self._refresh = True
                self._dirty.set()
                # Jittered exponential backoff: no hot loop while a failover is under way.
                await backoff.sleep()
                continue
            backoff.reset()
            if moved and not self._lost:
                # Found by the periodic check: the channels were gone for a while.
                self._lost = True
                self._on_reconnect()
            if self._lost and not self._dirty.is_set():
                self._lost = False
                logger.info("redis cluster subscriptions restored", extra={"moved": len(moved)})
                self._on_reconnect()

    def _owner(self, channel: str) -> ClusterNode:
        """The master serving ``channel``'s slot in the latest slot map."""
        node = self._cluster.get_node_from_key(channel)
        if node is None:
            raise SlotNotCoveredError(f"no master serves the slot of {channel!r}")
        return node

    def _in_place(self, channel: str) -> bool:
        node = self._placed.get(channel)
        return node is not None and node.name == self._owner(channel).name


class _NodeSubscriber:
    """One subscriber connection to one cluster node, read by its own task."""

    def __init__(self, node: ClusterNode, owner: ShardedSubscriber) -> None:
        self.name: str = node.name
        self.channels: set[str] = set()
        # SUNSUBSCRIBEs we sent whose confirmation has not arrived, by channel.
        self.unsubscribing: Counter[str] = Counter()
        self._owner = owner
        self._pool = node_pool(node)
        self._pubsub = PubSub(self._pool)
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect, then start the reader; raises when the node does not answer."""
        try:
            await self._pubsub.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            await self.close()
            raise
        self._reader = asyncio.create_task(
            self._read_loop(), name=f"queuert-notify redis cluster reader {self.name}"
        )

    async def send(self, command: str, channel: str) -> None:
        # Straight on the connection, not through PubSub.ssubscribe(): our placement
        # map, not redis-py's resubscribe-on-reconnect, decides where a channel lives,
        # and no health-check PING may read a reply meant for the reader.
        connection = self._pubsub.connection
        if connection is None:
            raise RedisConnectionError(f"the subscriber connection to {self.name} is closed")
        await connection.send_command(command, channel, check_health=False)

    async def _read_loop(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=_READ_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except AskError as exc:  # MOVED or ASK: an SSUBSCRIBE reached the wrong node
                self._owner._slot_moved(self, exc.slot_id)
                continue
            except Exception as exc:
                # A dead connection, or an error reply we cannot attribute to a channel.
                self._owner._node_failed(self, exc)
                return
            if message is not None:
                self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        kind, channel = message.get("type"), message.get("channel")
        if not isinstance(channel, bytes):
            return
        name = channel.decode("utf-8", "replace")
        if kind == "smessage":
            self._owner._on_message(name, message.get("data"))
        elif kind == "ssubscribe":
            self._owner._confirmed(self, name)
        elif kind == "sunsubscribe":
            self._owner._unsubscribed(self, name)

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._pool.aclose()


def node_pool(node: ClusterNode, **overrides: Any) -> ConnectionPool:
    """A pool of one connection of our own reaching ``node`` with the cluster client's
    credentials and TLS settings, returning raw bytes (payloads are decoded and checked
    by the caller); ``overrides`` replace connection settings (a socket timeout)."""
    kwargs = {
        key: value
        for key, value in node.connection_kwargs.items()
        if key not in _NODE_INTERNAL_KWARGS and "maint" not in key and not key.startswith("orig_")
    }
    kwargs.update(overrides)
    return ConnectionPool(
        connection_class=node.connection_class,
        max_connections=1,
        decode_responses=False,
        health_check_interval=_HEALTH_CHECK,
        # No silent reconnect: a failed connection is replaced by following the slot map.
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )
