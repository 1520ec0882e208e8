"""Where the keys of ``wake="lists"`` live, and the blocking connections a consumer
moves tokens on: one server, or a Redis Cluster.

A *lane* is a set of types whose keys share a hash slot: one blocking command
(``BLMOVE``/``BLMPOP``) may wait on all of them, and one script call may touch all
of them. On one server every type is in one lane; on a cluster every type's keys
carry the type as their hash tag, so a lane is the types of one slot.

One blocking connection per lane, not per node: a blocking command occupies its
connection until it returns, and a command naming keys of two slots is refused
(``CROSSSLOT``) even when one node serves both. Sharing one connection per node
would need a doorbell key in a third slot, which the push script could not write
in its own atomic step (a script touches only its own slot), and which consumers
of other types would have to pop and give back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import SlotNotCoveredError

from queuert_notify.notify.protocol import SignalCallback, Unsubscribe
from queuert_notify.notify.redis.sharded_subscriber import node_pool
from queuert_notify.notify.redis.shared import hash_tag

logger = logging.getLogger(__name__)

BLOCK_TIMEOUT = 5.0
"""Seconds one blocking move waits before it is sent again (a liveness check)."""
SOCKET_TIMEOUT = BLOCK_TIMEOUT + 5.0
"""A blocking move waits ``BLOCK_TIMEOUT`` on the server; its socket waits longer, so
only a server that stopped answering (not an idle list) times it out."""
_UNBLOCK_TIMEOUT = 0.5  # seconds a CLIENT UNBLOCK may take (its node may be gone)
_NUDGE_GRACE = 2.0  # seconds a nudge keeps trying to end a blocking move
_NUDGE_EVERY = 0.05  # seconds between its tries (the move may not have reached the server)


class BlockingLine(Protocol):
    """One connection of its own for one lane's blocking moves."""

    async def open(self) -> int:
        """Connect (again) where the lane's keys live now; the connection's client id."""
        ...

    async def call(self, *args: str | int | float) -> Any:
        """Send a command on the connection (a blocking move, or the push after one)."""
        ...

    async def unblock(self, client_id: int) -> bool:
        """End a blocking command on the connection at once, with an ``UNBLOCKED`` error
        (it did nothing); whether one was blocked. Not as if it timed out: that crashes a
        server without redis/redis#14164 (Redis 7.0 here) when the command is held back by
        a write pause (a manual failover pauses writes), where ``ERROR`` refuses it."""
        ...

    def failed(self) -> None:
        """A call failed: before the next ``open``, learn where the keys live."""
        ...

    async def ping(self) -> Any:
        """Send ``PING`` on the connection; the next reply on it, unparsed: not ``PONG``
        when it is the late reply of a command sent before."""
        ...

    async def drop(self) -> None:
        """Close the connection: a command held back on it is discarded, and no late
        reply is read as another command's. The next ``open`` connects again."""
        ...

    async def close(self) -> None: ...


class LaneKeys(Protocol):
    """How keys are named and grouped into lanes (all a producer needs)."""

    def tag(self, type_name: str) -> str:
        """What stands for the type in its keys (``{prefix}:wake:{tag}...``)."""
        ...

    def lane(self, key: str) -> int:
        """The lane of a type, from one of its keys: equal for keys one command may name."""
        ...


class ListsPlacement(LaneKeys, Protocol):
    """How keys are named and grouped into lanes, and how a lane's line is made."""

    def line(self, key: str) -> BlockingLine:
        """A new blocking connection for the lane of ``key``."""
        ...


class ServerPlacement:
    """One server: keys named by the bare type, every type in one lane."""

    def __init__(self, commands: Redis, pool: ConnectionPool) -> None:
        self._commands = commands
        self._pool = pool

    def tag(self, type_name: str) -> str:
        return type_name

    def lane(self, key: str) -> int:
        return 0

    def line(self, key: str) -> BlockingLine:
        return _ServerLine(self._commands, self._pool)


class ClusterKeys:
    """A Redis Cluster: a type's keys hash-tagged by the type, a lane per slot."""

    def tag(self, type_name: str) -> str:
        return hash_tag(type_name)

    def lane(self, key: str) -> int:
        return key_slot(key.encode())


class ClusterPlacement(ClusterKeys):
    """A Redis Cluster's keys (:class:`ClusterKeys`), a line to the master of each slot."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster

    def line(self, key: str) -> BlockingLine:
        return _ClusterLine(self._cluster, key)


class _ServerLine:
    """The one blocking connection to the server (one lane); unblocked through the
    command connection."""

    def __init__(self, commands: Redis, pool: ConnectionPool) -> None:
        self._commands = commands
        # One connection: its client id is what CLIENT UNBLOCK interrupts.
        self._client = Redis(connection_pool=pool, single_connection_client=True)

    async def open(self) -> int:
        return int(await self._client.client_id())

    async def call(self, *args: str | int | float) -> Any:
        return await self._client.execute_command(*args)  # type: ignore[no-untyped-call]

    async def unblock(self, client_id: int) -> bool:
        # Bounded: the server may be hanging, and a stop must not wait for it.
        with suppress(TimeoutError):
            async with asyncio.timeout(_UNBLOCK_TIMEOUT):
                return bool(await self._commands.client_unblock(client_id, error=True))
        return False

    async def ping(self) -> Any:
        return await _next_reply(self._client)

    def failed(self) -> None:
        """Nothing to look up: the connection reconnects to the same address."""

    async def drop(self) -> None:
        await _disconnect(self._client)

    async def close(self) -> None:
        await self._client.aclose(close_connection_pool=True)


class _ClusterLine:
    """A connection to the master serving one slot, following the slot when it moves
    or fails over: after a failed call (a dropped connection, ``MOVED``, ``ASK``, a
    timeout) the next ``open`` refreshes the slot map and connects to the owner."""

    def __init__(self, cluster: RedisCluster, key: str) -> None:
        self._cluster = cluster
        self._key = key
        self._node: ClusterNode | None = None
        self._client: Redis | None = None
        self._stale = False

    async def open(self) -> int:
        if self._stale:
            await self._cluster.nodes_manager.initialize()
            self._stale = False
        owner = self._cluster.get_node_from_key(self._key)
        if owner is None:
            raise SlotNotCoveredError(f"no master serves the slot of {self._key!r}")
        if self._client is None or self._node is None or self._node.name != owner.name:
            await self.close()
            self._node = owner
            pool = node_pool(owner, socket_timeout=SOCKET_TIMEOUT)
            self._client = Redis(connection_pool=pool, single_connection_client=True)
        return int(await self._client.client_id())

    async def call(self, *args: str | int | float) -> Any:
        if self._client is None:
            raise RuntimeError("open() the line first")
        return await self._client.execute_command(*args)  # type: ignore[no-untyped-call]

    async def unblock(self, client_id: int) -> bool:
        node = self._node
        if node is None:
            return False
        # Bounded: the node may be dead or hanging, and a stop must not wait for it.
        with suppress(TimeoutError):
            async with asyncio.timeout(_UNBLOCK_TIMEOUT):
                ended = await self._cluster.client_unblock(client_id, error=True, target_nodes=node)
                return any(ended.values()) if isinstance(ended, dict) else bool(ended)
        return False

    async def ping(self) -> Any:
        if self._client is None:
            raise RuntimeError("open() the line first")
        return await _next_reply(self._client)

    def failed(self) -> None:
        self._stale = True

    async def drop(self) -> None:
        if self._client is not None:
            await _disconnect(self._client)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose(close_connection_pool=True)


async def _next_reply(client: Redis) -> Any:
    """``PING`` on a single-connection client; the next reply read, not parsed as PING's."""
    await client.initialize()
    connection = client.connection
    if connection is None:
        raise RuntimeError("no connection")
    await connection.send_command("PING")
    return await connection.read_response()


async def _disconnect(client: Redis) -> None:
    """Close a single-connection client's connection (reopened by its next command)."""
    if client.connection is not None:
        await client.connection.disconnect()


@dataclass(eq=False)
class Lane:
    """Types whose keys share a slot (every type, on one server), the connection one
    blocking command waits on them with, and the loop sending it."""

    key: int
    line: BlockingLine
    types: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client_id: int | None = None  # of the line's connection, to unblock it
    recount: bool = False  # count the processing lists again before blocking next
    moving: frozenset[str] = frozenset()  # the types the blocking move waits on (none: idle)
    moves: int = 0  # blocking moves sent
    _nudging: asyncio.Task[None] | None = None
    _nudged: int = 0  # the move the nudging task ends

    def nudge(self) -> None:
        """End the blocking move now (the loop then looks again at what to wait on). A
        nudge still trying to end an earlier move is replaced: that move may have been
        served, and the task would give up on seeing this one, leaving it to time out."""
        if not self.moving:
            return
        running = self._nudging is not None and not self._nudging.done()
        if running and self._nudged == self.moves:
            return
        if self._nudging is not None:
            self._nudging.cancel()
        self._nudged = self.moves
        self._nudging = asyncio.create_task(self._end_move(self.moves))

    async def stop_nudging(self) -> None:
        task, self._nudging = self._nudging, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _end_move(self, move: int) -> None:
        deadline = asyncio.get_running_loop().time() + _NUDGE_GRACE
        while self.moving and self.moves == move and self.client_id is not None:
            # Again until it ends one: the move may not have reached the server yet.
            with suppress(Exception):
                if await self.line.unblock(self.client_id):
                    return
            if asyncio.get_running_loop().time() >= deadline:
                return
            await asyncio.sleep(_NUDGE_EVERY)


class LaneLosses:
    """Which lanes' connections are lost, and the callbacks run when one is lost or the
    last one restored (tokens may have been lost with a restarted server: poll now)."""

    def __init__(self, address: str, run: Callable[[SignalCallback], None]) -> None:
        self._address = address
        self._run = run
        self._callbacks: dict[int, SignalCallback] = {}
        self._next_id = 0
        self._lost: set[int] = set()  # lane keys

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        callback_id = self._next_id
        self._next_id += 1
        self._callbacks[callback_id] = callback

        async def unsubscribe() -> None:
            self._callbacks.pop(callback_id, None)

        return unsubscribe

    def lose(self, lane: Lane, exc: Exception) -> None:
        """The lane's connection failed: poll now (once for every lost lane at a time)."""
        first = not self._lost
        self._lost.add(lane.key)
        if first:
            logger.warning(
                "redis wake lists lost the connection; reconnecting",
                extra={"address": self._address, "error": repr(exc)},
            )
            self._fire()

    def restored(self, lane: Lane) -> None:
        """The lane blocks again: poll now if it was the last one lost."""
        if lane.key not in self._lost:
            return
        self._lost.discard(lane.key)
        if not self._lost:
            logger.info("redis wake lists reconnected", extra={"address": self._address})
            self._fire()

    def forget(self, lane: Lane) -> None:
        """The lane is gone (its last type left)."""
        self._lost.discard(lane.key)

    def clear(self) -> None:
        """Run no callback any more (the consumer closed)."""
        self._callbacks.clear()

    def _fire(self) -> None:
        for callback in list(self._callbacks.values()):
            self._run(callback)
