"""Redis helpers for tests: clean up only the keys a test's own prefix created; wait
for subscribers the server itself counts; publish as ``SyncClient`` does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis

from queuert_notify import RedisNotifyAdapter
from state_adapters.notifications import NotificationBuffer


async def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``{prefix}:`` (never FLUSHDB: the server is shared)."""
    client = Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


async def wait_for_subscribers(url: str, channel: str, count: int, within: float) -> None:
    """Wait until ``channel`` has ``count`` subscribers on the server at ``url``."""
    admin = Redis.from_url(url)
    try:
        async with asyncio.timeout(within):
            while True:  # polling the server's own count; there is no event to wait on
                if dict(await admin.pubsub_numsub(channel))[channel.encode()] == count:
                    return
                await asyncio.sleep(0.05)
    finally:
        await admin.aclose()


async def poison_redis_budget(
    client: Any, key_of: Callable[[str], str], type_name: str, kind: str
) -> None:
    """Store what a stranger or a bug might as the wake budget of ``type_name``: a string
    that is no integer ("text"), or a list ("list"); neither has a TTL."""
    key = key_of(type_name)
    await client.delete(key)
    if kind == "text":
        await client.set(key, "not-a-number")
    else:
        await client.rpush(key, "1", "2")


def named(url: str, client_name: str) -> str:
    """``url`` asking every connection opened from it to call itself ``client_name``
    (CLIENT SETNAME), so a test can find them in CLIENT LIST on a shared server."""
    return f"{url}{'&' if '?' in url else '?'}client_name={client_name}"


async def kill_subscribers(url: str, client_name: str) -> None:
    """CLIENT KILL every subscriber connection named ``client_name`` (see :func:`named`);
    the server stays up and nobody else's connection is touched."""
    admin = Redis.from_url(url)
    try:
        mine = [c for c in await admin.client_list(_type="pubsub") if c["name"] == client_name]
        assert mine, f"no subscriber connection named {client_name!r}"
        for client in mine:
            await admin.client_kill_filter(_id=client["id"])
    finally:
        await admin.aclose()


async def publish_blocking(notify: RedisNotifyAdapter, type_names: Sequence[str]) -> None:
    """Announce one job of each of ``type_names`` the way ``SyncClient``'s sender thread
    does: through ``notify``'s blocking publisher, on a thread of its own."""
    notes = NotificationBuffer()
    for type_name in type_names:
        notes.job_scheduled(type_name)
    publisher = notify.blocking_publisher()

    def publish() -> None:
        try:
            publisher.publish(notes)
        finally:
            publisher.close()

    await asyncio.to_thread(publish)
