"""RedisNotifyAdapter settings, ownership of connections, and a clean close."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from queuert_notify import ConfigurationError, InvalidInputError, RedisNotifyAdapter
from queuert_notify.notify.redis.adapter import MAX_PAYLOAD_BYTES
from queuert_notify.testing import Recorder
from tests.support.redis_helpers import delete_prefix
from tests.support.services import OwnServer, free_port, own_redis_server


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "memcached://x", "", "redis+sentinel://h"]
)
def test_an_unsupported_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"redis://, rediss:// or unix://"):
        RedisNotifyAdapter(url)


@pytest.mark.parametrize("prefix", ["", "has space", "a:b", "a*", "{tag}", "é"])
def test_a_prefix_outside_the_allowed_characters_is_a_configuration_error(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        RedisNotifyAdapter("redis://127.0.0.1:6379/0", prefix=prefix)


def test_url_and_client_are_exclusive_and_one_is_required() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        RedisNotifyAdapter()
    with pytest.raises(ConfigurationError, match="exactly one"):
        RedisNotifyAdapter("redis://127.0.0.1:6379/0", client=Redis())


def test_a_client_that_is_not_redis_asyncio_is_a_configuration_error() -> None:
    import redis

    with pytest.raises(ConfigurationError, match=r"redis\.asyncio\.Redis"):
        RedisNotifyAdapter(client=redis.Redis())  # type: ignore[arg-type]


async def test_an_unreachable_server_fails_connect_naming_the_address_without_password() -> None:
    port = free_port()
    adapter = RedisNotifyAdapter(f"redis://:hunter2@127.0.0.1:{port}/0", connect_timeout=2.0)
    with pytest.raises(ConfigurationError) as raised:
        await adapter.connect()
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message
    assert "hunter2" not in message
    assert "is the server running?" in message
    await adapter.close()


async def test_async_with_on_an_unreachable_server_leaves_no_task() -> None:
    before = asyncio.all_tasks()
    with pytest.raises(ConfigurationError):
        async with RedisNotifyAdapter(f"redis://127.0.0.1:{free_port()}/0"):
            pass
    assert asyncio.all_tasks() == before


async def test_close_leaves_no_task_running(redis_url: str, prefix: str) -> None:
    before = asyncio.all_tasks()
    adapter = RedisNotifyAdapter(redis_url, prefix=prefix)
    await adapter.connect()
    adapter.on_reconnect(Recorder())
    await adapter.listen_job_scheduled(["t"], Recorder())
    await adapter.listen_chain_completed("c", Recorder())
    assert asyncio.all_tasks() != before, "the reader task runs while connected"

    await adapter.close()

    assert asyncio.all_tasks() == before


async def test_a_caller_owned_client_is_used_and_never_closed(redis_url: str, prefix: str) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_job_scheduled(["t"], rec)
            await adapter.notify_jobs_scheduled({"t": 1})
            await rec.wait_for(1, within=5.0)
            assert rec.calls == [("t",)]
            assert await client.get(f"{prefix}:hint:t") == "1", "budgets went through the client"
        assert await client.ping() is True, "the caller's client still works after close()"
    finally:
        await client.aclose()
        await delete_prefix(redis_url, prefix)


async def test_a_caller_owned_client_gets_its_password_reused_for_the_subscriber(
    tmp_path: Path, prefix: str
) -> None:
    for server in own_redis_server(tmp_path, "--requirepass", "s3cret"):
        client = Redis.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/0")
        try:
            async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
                rec = Recorder()
                await adapter.listen_chain_completed("c", rec)
                await adapter.notify_chain_completed("c")
                await rec.wait_for(1, within=5.0)
        finally:
            await client.aclose()


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[tuple[OwnServer, Path]]:
    socket_path = tmp_path / "r.sock"
    for server in own_redis_server(tmp_path, "--unixsocket", str(socket_path)):
        yield server, socket_path


async def test_a_unix_socket_url_works(unix_redis: tuple[OwnServer, Path], prefix: str) -> None:
    _, socket_path = unix_redis
    async with RedisNotifyAdapter(f"unix://{socket_path}", prefix=prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_ownership_lost("j", rec)
        await adapter.notify_job_ownership_lost("j")
        await rec.wait_for(1, within=5.0)
        assert await adapter.consume_wake_hint("t") is True


async def test_payloads_receivers_would_drop_are_refused_before_publishing(
    redis_url: str, prefix: str
) -> None:
    async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
        with pytest.raises(InvalidInputError):
            await adapter.notify_job_scheduled("")
        with pytest.raises(InvalidInputError):
            await adapter.notify_chain_completed("x" * (MAX_PAYLOAD_BYTES + 1))
        with pytest.raises(InvalidInputError):
            await adapter.notify_jobs_scheduled({"t": -1})
        with pytest.raises(InvalidInputError):
            await adapter.provide_wake_hint("t", -1)


async def test_calls_before_connect_connect_lazily(redis_url: str, prefix: str) -> None:
    adapter = RedisNotifyAdapter(redis_url, prefix=prefix)
    try:
        rec = Recorder()
        await adapter.listen_chain_completed("c", rec)
        await adapter.notify_chain_completed("c")
        await rec.wait_for(1, within=5.0)
    finally:
        await adapter.close()
