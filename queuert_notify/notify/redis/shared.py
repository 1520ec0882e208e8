"""What both Redis transports (single server and cluster) and the blocking publisher
share: the wire names, the Lua scripts, the connection retry policy and the wake-budget
calls (:class:`BudgetChannelAdapter`)."""

from __future__ import annotations

import asyncio
import hashlib
from abc import abstractmethod
from collections.abc import Awaitable, Sequence
from importlib.resources import files
from typing import TypeVar

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry as BlockingRetry

from queuert_notify.notify.channel_adapter import ChannelNotifyAdapter
from queuert_notify.notify.payloads import check_count, encode_payload
from queuert_notify.notify.protocol import HINT_TTL_SECONDS

_T = TypeVar("_T")

RETRY_ATTEMPTS = 3
"""Retries of a failed connect or command on a connection the adapter opened: a
connection gone stale (e.g. a server restart) is replaced, not fatal."""


def lua_script(name: str) -> str:
    """The script ``lua/{name}.lua`` behind the budget prelude (``lua/budget.lua``) every
    wake-budget script shares."""
    folder = files("queuert_notify.notify.redis") / "lua"
    return "".join(
        (folder / f"{part}.lua").read_text(encoding="utf-8") for part in ("budget", name)
    )


PROVIDE_WAKE_HINT = lua_script("provide_wake_hint")
CONSUME_WAKE_HINT = lua_script("consume_wake_hint")
NOTIFY_JOBS_SCHEDULED = lua_script("notify_jobs_scheduled")
PUBLISH_MANY = lua_script("publish_many")

ScriptCall = tuple[list[str], list[str | int]]
"""The KEYS and ARGV of one script call: what the async adapter and the blocking
publisher both send, built once by the same function."""


# Wire names live in these two functions only (cluster names: redis_cluster.py).
def channel_name(prefix: str, kind: str) -> str:
    """The Pub/Sub channel of one notification kind (``sched``, ``chainc``, ``owls``)."""
    return f"{prefix}:{kind}"


def hint_key(prefix: str, type_name: str) -> str:
    """The string key holding the wake budget of ``type_name``."""
    return f"{prefix}:hint:{type_name}"


def hash_tag(value: str) -> str:
    """``value`` as a Redis Cluster hash tag (``{value}``): names carrying it share a slot.
    A value that is empty or holds ``}`` (which would end the tag early) is tagged by
    a digest instead, followed by the value: ``{#<hex>}:value``."""
    if value and "}" not in value:
        return f"{{{value}}}"
    digest = hashlib.blake2b(value.encode(), digest_size=8).hexdigest()
    return f"{{#{digest}}}:{value}"


def _lua(name: str) -> str:
    """The script ``lua/{name}.lua`` as it is (the lists-mode scripts share no prelude)."""
    return (files("queuert_notify.notify.redis") / "lua" / f"{name}.lua").read_text(
        encoding="utf-8"
    )


# The scripts and wire names of wake="lists" (layout: redis_lists.py).
PUSH_WAKE_TOKENS = _lua("push_wake_tokens")
TAKE_WAKE_TOKEN = _lua("take_wake_token")
WAKE_HEARTBEAT = _lua("wake_heartbeat")
RETURN_WAKE_TOKENS = _lua("return_wake_tokens")


def token_list_key(prefix: str, type_name: str) -> str:
    """The list of wake tokens of ``type_name``."""
    return f"{prefix}:wake:{type_name}"


def issued_key(prefix: str, type_name: str) -> str:
    """The marker saying tokens of ``type_name`` were issued lately (or overflowed)."""
    return f"{prefix}:wake:{type_name}:issued"


def processing_key(prefix: str, type_name: str, consumer: str) -> str:
    """The tokens of ``type_name`` that ``consumer`` moved and has not acknowledged."""
    return f"{prefix}:wake:{type_name}:proc:{consumer}"


def consumers_key(prefix: str, type_name: str) -> str:
    """The consumers of ``type_name`` scored by the time until which they are alive."""
    return f"{prefix}:wake:{type_name}:consumers"


def connection_retry() -> Retry:
    """Retry policy of the connections the adapter opens (from_url pools retry nothing)."""
    return Retry(_backoff(), RETRY_ATTEMPTS)


def blocking_connection_retry() -> BlockingRetry:
    """The same policy for a blocking client (``SyncClient``'s cluster publisher)."""
    return BlockingRetry(_backoff(), RETRY_ATTEMPTS)


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=1.0, base=0.05)


async def all_at_once(calls: Sequence[Awaitable[_T]]) -> list[_T]:
    """Await every call together (one round trip of wall time, however many nodes they
    go to); the first failure is raised once every call has ended, so nothing is left
    in flight. One call is awaited directly (no task)."""
    if len(calls) == 1:
        return [await calls[0]]
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]


class BudgetChannelAdapter(ChannelNotifyAdapter):
    """A channel adapter whose wake budgets are string keys (named by :meth:`_hint_key`)
    changed only by the budget scripts ``_provide_script`` and ``_consume_script``
    (``PROVIDE_WAKE_HINT``, ``CONSUME_WAKE_HINT``), both sent once
    :meth:`_ready_to_send` lets commands through."""

    _provide_script: AsyncScript
    _consume_script: AsyncScript

    @abstractmethod
    def _hint_key(self, type_name: str) -> str:
        """The key of ``type_name``'s wake budget (``type_name`` already checked)."""

    async def _ready_to_send(self) -> None:
        """Wait until commands may be sent: connected."""
        await self._ready()

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the budget (INCRBY + EXPIRE 60 s, atomically); 0 is a no-op."""
        check_count(count)
        key = self._hint_key(encode_payload("type name", type_name))
        await self._ready_to_send()
        if count == 0:
            # INCRBY 0 would create an exhausted budget and hold consumers back.
            return
        await self._provide_script(keys=[key], args=[count, HINT_TTL_SECONDS])

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Take one unit; True when taken or when no budget exists, False when exhausted."""
        key = self._hint_key(encode_payload("type name", type_name))
        await self._ready_to_send()
        taken = await self._consume_script(keys=[key], args=[HINT_TTL_SECONDS])
        return bool(taken)
