"""Redis helpers for tests: clean up only the keys a test's own prefix created."""

from __future__ import annotations

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
