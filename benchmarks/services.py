"""Where the benchmarks find Redis and Postgres, and how they clean up after themselves.

The servers are shared (other people's tests run against them): every run
works under a prefix of its own and deletes only the keys under it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from redis.asyncio import Redis

if TYPE_CHECKING:
    from tests.support.redis_cluster import LocalRedisCluster

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for a server of a run's own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, server: subprocess.Popen[bytes] | None = None, timeout: float = 10.0
) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``; RuntimeError
    after ``timeout`` seconds, or at once when ``server`` (the process meant to listen
    there) has exited: a port taken meanwhile makes it abort at start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            if server is None or server.poll() is None:  # not another process's port
                return
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the server for 127.0.0.1:{port} exited ({server.returncode})")
        time.sleep(0.02)
    raise RuntimeError(f"nothing answers on 127.0.0.1:{port} after {timeout}s")


def redis_url() -> str:
    """``QUEUERT_BENCH_REDIS_URL``, else the local default."""
    return os.environ.get("QUEUERT_BENCH_REDIS_URL", DEFAULT_REDIS_URL)


def postgres_url() -> str:
    """``QUEUERT_BENCH_POSTGRES_URL``, else the local default."""
    return os.environ.get("QUEUERT_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def nats_url() -> str:
    """``QUEUERT_BENCH_NATS_URL``, else the local default."""
    return os.environ.get("QUEUERT_BENCH_NATS_URL", DEFAULT_NATS_URL)


def unique_prefix() -> str:
    """A key/channel/table prefix no other run uses."""
    return f"qbench{uuid.uuid4().hex[:10]}"


async def delete_redis_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``{prefix}:`` (never FLUSHDB: the server is shared)."""
    client = Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


async def redis_server_version(url: str) -> str:
    """The ``redis_version`` the server at ``url`` reports."""
    client = Redis.from_url(url)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    return str(info.get("redis_version", "?"))


async def delete_nats_bucket(url: str, bucket: str) -> None:
    """Delete the JetStream KV bucket a run created (its wake budgets)."""
    import nats
    from nats.js.errors import NotFoundError

    connection = await nats.connect(url)
    try:
        with suppress(NotFoundError):
            await connection.jetstream().delete_key_value(bucket)
    finally:
        await connection.close()


async def nats_server_version(url: str) -> str:
    """The version the NATS server at ``url`` announces when a client connects."""
    import nats

    connection = await nats.connect(url)
    try:
        version = connection.connected_server_version
        return f"{version.major}.{version.minor}.{version.patch}"
    finally:
        await connection.close()


async def postgres_server_version(url: str) -> str:
    """``server_version`` of the Postgres at ``url`` (a SQLAlchemy URL)."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return str(await conn.scalar(text("SHOW server_version")))
    finally:
        await engine.dispose()


@asynccontextmanager
async def local_redis_cluster() -> AsyncIterator[LocalRedisCluster]:
    """A fresh local Redis Cluster (3 masters + 3 replicas) of the run's own, killed on
    exit (``tests/support/redis_cluster.py``)."""
    from tests.support.redis_cluster import LocalRedisCluster

    with tempfile.TemporaryDirectory(prefix="queuert-bench-cluster-") as workdir:
        cluster = LocalRedisCluster(Path(workdir))
        try:
            await asyncio.to_thread(cluster.start)
            yield cluster
        finally:
            await asyncio.to_thread(cluster.stop)
