"""The connections a single-server ``RedisNotifyAdapter`` opens: its command client and
the pools of its dedicated connections (subscriber, lists-mode blocking connection),
from a URL or copied from a caller-owned client."""

from __future__ import annotations

from redis.asyncio import ConnectionPool, Redis

from queuert_notify.errors import ConfigurationError, mask_url
from queuert_notify.notify.redis_shared import connection_retry

_SCHEMES = ("redis", "rediss", "unix")
_SUBSCRIBER_HEALTH_CHECK = 30  # seconds; PING an idle subscriber so a dead socket is noticed
# Connection settings a pool injects into its own connections; a copied pool makes its own.
_POOL_INTERNAL_KWARGS = ("himport_registry", "event_dispatcher", "redis_connect_func")


def clients_for_url(url: str) -> tuple[str, Redis, ConnectionPool]:
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


def clients_for_caller(client: object) -> tuple[str, Redis, ConnectionPool]:
    """A caller-owned client's address, the client itself (never closed by the adapter)
    and a subscriber pool of the adapter's own reaching the same server."""
    if not isinstance(client, Redis):
        raise ConfigurationError(
            f"client must be a redis.asyncio.Redis (or, for Redis Cluster, a "
            f"redis.asyncio.cluster.RedisCluster), not {type(client).__name__}"
        )
    return describe_pool(client.connection_pool), client, copy_pool(client.connection_pool)


def copy_pool(pool: ConnectionPool) -> ConnectionPool:
    """A new pool reaching the same server as ``pool`` with the same credentials and
    TLS settings, returning raw bytes (payloads are decoded and checked here)."""
    kwargs = {
        key: value
        for key, value in pool.connection_kwargs.items()
        if key not in _POOL_INTERNAL_KWARGS and "maint" not in key and not key.startswith("orig_")
    }
    kwargs.update(decode_responses=False, health_check_interval=_SUBSCRIBER_HEALTH_CHECK)
    return ConnectionPool(connection_class=pool.connection_class, **kwargs)


def describe_pool(pool: ConnectionPool) -> str:
    """Where ``pool`` connects, for error messages (never the password)."""
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}"
