"""Redis fixtures: ``redis``, a client of the shared server decoding replies, that
deletes the test's own keys (its ``prefix``) afterwards.
A module uses them with ``pytest_plugins = ["tests.support.redis_fixtures"]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.support.redis_helpers import delete_prefix


@pytest.fixture
async def redis(redis_url: str, prefix: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()
    await delete_prefix(redis_url, prefix)
