"""What both Redis transports (single server and cluster) and the blocking publisher
share: the wire names, the Lua scripts and the connection retry policy."""

from __future__ import annotations

from importlib.resources import files

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

RETRY_ATTEMPTS = 3
"""Retries of a failed connect or command on a connection the adapter opened: a
connection gone stale (e.g. a server restart) is replaced, not fatal."""


def lua_script(name: str) -> str:
    """The script ``lua/{name}.lua`` behind the budget prelude (``lua/budget.lua``) every
    wake-budget script shares."""
    folder = files("queuert_notify.notify") / "lua"
    return "".join(
        (folder / f"{part}.lua").read_text(encoding="utf-8") for part in ("budget", name)
    )


PROVIDE_WAKE_HINT = lua_script("provide_wake_hint")
CONSUME_WAKE_HINT = lua_script("consume_wake_hint")
NOTIFY_JOBS_SCHEDULED = lua_script("notify_jobs_scheduled")


# Wire names live in these two functions only (cluster names: redis_cluster.py).
def channel_name(prefix: str, kind: str) -> str:
    """The Pub/Sub channel of one notification kind (``sched``, ``chainc``, ``owls``)."""
    return f"{prefix}:{kind}"


def hint_key(prefix: str, type_name: str) -> str:
    """The string key holding the wake budget of ``type_name``."""
    return f"{prefix}:hint:{type_name}"


def _lua(name: str) -> str:
    """The script ``lua/{name}.lua`` as it is (the lists-mode scripts share no prelude)."""
    return (files("queuert_notify.notify") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


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
    return Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), RETRY_ATTEMPTS)
