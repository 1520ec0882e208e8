"""Publishing on a test prefix's notify channels the way a stranger would: raw bytes
from a connection of someone else's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import nats
import psycopg
import pytest
from redis.asyncio import Redis

from queuert_notify.notify import nats as nats_wire
from queuert_notify.notify import postgres as postgres_wire
from queuert_notify.notify.redis import shared as redis_wire

Publish = Callable[[str, bytes], Awaitable[None]]
"""Publish raw bytes on the channel of one notification kind (sched, chainc, owls);
returns once the server has the message."""


@asynccontextmanager
async def stranger(
    kind: str, request: pytest.FixtureRequest, prefix: str
) -> AsyncIterator[Publish]:
    """Publishing on ``prefix``'s channels from a connection of someone else's."""
    if kind == "redis":
        client = Redis.from_url(request.getfixturevalue("redis_url"))

        async def publish_redis(what: str, data: bytes) -> None:
            await client.publish(redis_wire.channel_name(prefix, what), data)

        try:
            yield publish_redis
        finally:
            await client.aclose()
    elif kind == "nats":
        connection = await nats.connect(request.getfixturevalue("nats_url"))

        async def publish_nats(what: str, data: bytes) -> None:
            await connection.publish(nats_wire.subject_name(prefix, what), data)
            await connection.flush()

        try:
            yield publish_nats
        finally:
            await connection.close()
    else:
        dsn = request.getfixturevalue("postgres_url").replace("+psycopg", "", 1)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:

            async def publish_postgres(what: str, data: bytes) -> None:
                channel = postgres_wire.channel_name(prefix, what)
                await connection.execute("SELECT pg_notify(%s, %s)", (channel, data.decode()))

            yield publish_postgres
