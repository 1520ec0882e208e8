"""Redis helpers for tests: clean up only the keys a test's own prefix created; wait
for subscribers the server itself counts."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis


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
