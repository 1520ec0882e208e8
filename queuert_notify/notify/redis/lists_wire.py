"""The wire of the ``wake="lists"`` mode (:mod:`~queuert_notify.notify.redis.lists`):
its keys, the pushes a producer sends, and one consumer's key names, blocking move and
heartbeat.

Wire layout (``{t}`` is a type name;
on a Redis Cluster it is the type as a hash tag, ``{<type>}`` with literal braces,
so every key of one type lives in one slot):

=======================================  ============  ==================================
key                                      type          holds
=======================================  ============  ==================================
``{prefix}:wake:{t}``                    list          wake tokens (``"1"``), at most
                                                       :data:`TOKEN_CAP`; TTL 60 s
                                                       from the last push
``{prefix}:wake:{t}:issued``             string        ``issued`` / ``overflow``: tokens
                                                       were pushed in the last 60 s
``{prefix}:wake:{t}:proc:{consumer}``    list          tokens one consumer moved and has
                                                       not acknowledged yet
``{prefix}:wake:{t}:consumers``          sorted set    consumer id -> server time (ms)
                                                       until which it is alive
=======================================  ============  ==================================
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from redis.exceptions import ResponseError

from queuert_notify.notify.payloads import decode_text, scheduled_counts
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.redis.lists_lines import BLOCK_TIMEOUT, Lane, LaneKeys
from queuert_notify.notify.redis.shared import (
    ScriptCall,
    all_at_once,
    consumers_key,
    issued_key,
    processing_key,
    token_list_key,
)

logger = logging.getLogger(__name__)

TOKEN_CAP = 10_000
"""No token list holds more tokens: a burst beyond it marks the list ``overflow`` and
consumers that find it empty wake anyway until the marker expires (60 s)."""

_STOP_GRACE = 2.0  # seconds the heartbeat gets to stop before it is cancelled
_IN_STEP_TIMEOUT = 0.5  # seconds the PING after an ended move may take (else reopened)


def token_pushes(prefix: str, counts: Mapping[str, int], keys: LaneKeys) -> list[ScriptCall]:
    """The calls of ``push_wake_tokens.lua`` adding ``counts[t]`` tokens for every type
    ``t``: one per lane involved (none for no count above 0). Every name and count is
    checked first (``InvalidInputError``)."""
    by_lane: dict[int, ScriptCall] = {}
    for name, count in scheduled_counts(counts).items():
        tag = keys.tag(name)
        tokens = token_list_key(prefix, tag)
        call_keys, args = by_lane.setdefault(keys.lane(tokens), ([], [HINT_TTL_SECONDS, TOKEN_CAP]))
        call_keys += [tokens, issued_key(prefix, tag)]
        args.append(count)
    return list(by_lane.values())


class ConsumerKeys:
    """The keys of one consumer (``consumer``) under ``prefix``, and the arguments of its
    heartbeat script (``lua/wake_heartbeat.lua``)."""

    def __init__(self, prefix: str, keys: LaneKeys, consumer: str, timeout: float) -> None:
        self._prefix = prefix
        self._placement = keys
        self.consumer = consumer
        self.timeout = timeout

    def tokens(self, type_name: str) -> str:
        return token_list_key(self._prefix, self._placement.tag(type_name))

    def processing(self, type_name: str, consumer: str | None = None) -> str:
        tag = self._placement.tag(type_name)
        return processing_key(self._prefix, tag, self.consumer if consumer is None else consumer)

    def consumers(self, type_name: str) -> str:
        return consumers_key(self._prefix, self._placement.tag(type_name))

    def give_back_keys(self, type_name: str) -> list[str]:
        """The keys of ``lua/return_wake_tokens.lua`` for ``type_name``."""
        return [self.processing(type_name), self.tokens(type_name), self.consumers(type_name)]

    def beat_keys(self, types: Sequence[str]) -> list[str]:
        keys: list[str] = []
        for name in types:
            keys += [self.consumers(name), self.tokens(name), self.processing(name)]
        return keys

    def beat_args(self, types: Sequence[str]) -> list[str | int]:
        prefixes = [self.processing(name, "") for name in types]
        return [self.consumer, int(self.timeout * 1000), HINT_TTL_SECONDS, *prefixes]


async def move_one(lane: Lane, keys: ConsumerKeys, types: Sequence[str]) -> str | None:
    """Block until a token of one of ``types`` (of the lane) is in the consumer's
    processing list of its type; that type, or None (the block timed out or was ended:
    :meth:`Lane.nudge`)."""
    if len(types) == 1:
        [type_name] = types
        tokens, processing = keys.tokens(type_name), keys.processing(type_name)
        moved = await _blocking(lane, types, "BLMOVE", tokens, processing, "LEFT", "RIGHT")
        return type_name if moved is not None else None
    by_key = {keys.tokens(name): name for name in types}
    reply = await _blocking(lane, types, "BLMPOP", len(by_key), *by_key, "LEFT", "COUNT", 1)
    if not reply:
        return None
    popped = by_key.get(decode_text(reply[0]) or "")
    if popped is None:
        return None
    # Not atomic with the pop: a consumer killed during this one round trip loses the
    # token (its job is still found by a catch-up poll). Held back by a write pause, the
    # push may be refused by a CLIENT UNBLOCK meant for the blocking move: Redis 7.0 still
    # runs it once writes resume unless its connection is gone, so it is sent again on a
    # new connection (the lane's nudges then unblock that one).
    while True:
        try:
            await lane.line.call("RPUSH", keys.processing(popped), *reply[1])
            return popped
        except ResponseError as exc:
            if not _unblocked(exc):
                raise
        await _reopen(lane)


async def _blocking(lane: Lane, types: Sequence[str], command: str, *args: str | int) -> Any:
    """Send the lane's blocking move (``BLMOVE`` or ``BLMPOP``, on ``types``); its reply,
    or None when it timed out or was ended (``CLIENT UNBLOCK ... ERROR``: it moved
    nothing, or see :func:`_in_step`)."""
    lane.moving = frozenset(types)
    lane.moves += 1
    timeout_first = command == "BLMPOP"
    command_args = (BLOCK_TIMEOUT, *args) if timeout_first else (*args, BLOCK_TIMEOUT)
    try:
        return await lane.line.call(command, *command_args)
    except ResponseError as exc:
        if not _unblocked(exc):
            raise
    finally:
        lane.moving = frozenset()
    return await _in_step(lane)


async def _in_step(lane: Lane) -> Any:
    """After a move ended ``UNBLOCKED``: None if it is gone, else its late reply. Held
    back by a write pause (a manual failover), Redis 7.0 answers it ``UNBLOCKED`` yet runs
    it once writes resume, its reply read as the next command's: so the connection's next
    reply must be a ``PING``'s at once. If not, that reply (if any) is the move's, and the
    connection is dropped (Redis discards a move not run yet) for a new one. A move run
    before Redis saw the drop is lost with its reply: a ``BLMOVE``'s token is in a
    processing list, which the lane counts again; a ``BLMPOP``'s is gone (its job is
    still found by a catch-up poll)."""
    reply = None
    try:
        async with asyncio.timeout(_IN_STEP_TIMEOUT):
            reply = await lane.line.ping()
            if reply in (b"PONG", "PONG"):
                return None
    except TimeoutError:
        pass
    except ResponseError as exc:
        if not _unblocked(exc):
            # The move's late reply was an error (READONLY after a failover): the PING's
            # own answer still waits on this connection, which no later command may read.
            await lane.line.drop()
            raise
        # A second unblock ended the held-back move: as if nothing had come.
    await _reopen(lane)
    return reply


async def _reopen(lane: Lane) -> None:
    """Drop the lane's connection (a command held back on it is discarded) for a new one,
    whose client id the lane's nudges unblock. A command held back may still have run
    before Redis saw the drop (a token moved, a push made twice): the lane counts its
    lists again."""
    await lane.line.drop()
    lane.client_id = await lane.line.open()
    lane.recount = True


def _unblocked(exc: ResponseError) -> bool:
    """Whether a command was refused or ended by ``CLIENT UNBLOCK ... ERROR``."""
    return str(exc).startswith("UNBLOCKED")


class Heartbeat:
    """Keeps one consumer alive and returns the tokens of dead ones: every ``timeout / 3``
    one heartbeat script per lane (``lanes()``: each lane's types), all at once, from
    :meth:`start` until :meth:`stop`. A failed beat is retried at the next one."""

    def __init__(
        self,
        beat: Callable[..., Awaitable[Any]],
        keys: ConsumerKeys,
        lanes: Callable[[], list[list[str]]],
        *,
        address: str,
        name: str,
    ) -> None:
        self._beat = beat
        self._keys = keys
        self._lanes = lanes
        self._address = address
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        """Start beating, unless it already does."""
        if self._task is None:
            stop = self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._loop(stop), name=self._name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        await asyncio.wait([task], timeout=_STOP_GRACE)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _loop(self, stop: asyncio.Event) -> None:
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._keys.timeout / 3)
            if stop.is_set():
                return
            beats = [
                self._beat(keys=self._keys.beat_keys(types), args=self._keys.beat_args(types))
                for types in self._lanes()
                if types
            ]
            try:
                returned = sum(int(n) for n in await all_at_once(beats))
            except Exception as exc:
                logger.debug("wake heartbeat failed: %r", exc)
                continue
            if returned:
                logger.info(
                    "returned wake tokens of stopped consumers",
                    extra={"address": self._address, "tokens": returned},
                )
