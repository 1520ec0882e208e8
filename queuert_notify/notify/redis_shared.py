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


def connection_retry() -> Retry:
    """Retry policy of the connections the adapter opens (from_url pools retry nothing)."""
    return Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), RETRY_ATTEMPTS)
