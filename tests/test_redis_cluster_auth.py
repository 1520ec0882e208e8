"""RedisNotifyAdapter on a Redis Cluster that requires a password: the subscriber's own
per-master connections, and SyncClient's blocking publisher, authenticate like the
cluster client, and no message shows the password."""

from __future__ import annotations

import traceback
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from queuert_notify import ConfigurationError, RedisNotifyAdapter
from queuert_notify.testing import Recorder
from tests.support.redis_cluster import (
    CLUSTER_CONNECT_TIMEOUT,
    LocalRedisCluster,
    local_redis_cluster,
)
from tests.support.redis_helpers import publish_blocking

# The module's cluster with a password (module scope) is started once: one xdist worker
# runs every test of the module.
pytestmark = pytest.mark.xdist_group(__name__)

PASSWORD = "s3cret-cluster"


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    yield from local_redis_cluster(tmp_path_factory.mktemp("redis-cluster-auth"), PASSWORD)


async def test_a_password_in_the_url_reaches_every_subscriber_connection(
    auth_cluster: LocalRedisCluster, prefix: str
) -> None:
    async with RedisNotifyAdapter(
        auth_cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
    ) as adapter:
        rec = Recorder()
        types = [f"type-{index}" for index in range(12)]  # spread over every master
        await adapter.listen_job_scheduled(types, rec)
        await adapter.notify_jobs_scheduled(dict.fromkeys(types, 1))
        await rec.wait_for(len(types), within=5.0)
        assert await adapter.consume_wake_hint(types[0]) is True
    auth_cluster.delete_prefix(prefix)


async def test_a_caller_owned_client_gets_its_password_reused_for_the_subscribers(
    auth_cluster: LocalRedisCluster, prefix: str
) -> None:
    client = RedisCluster.from_url(auth_cluster.url)
    try:
        async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_chain_completed("c", rec)
            await adapter.notify_chain_completed("c")
            await rec.wait_for(1, within=5.0)
    finally:
        await client.aclose()


async def test_a_wrong_password_fails_connect_without_showing_it(
    auth_cluster: LocalRedisCluster,
) -> None:
    url = auth_cluster.url.replace(PASSWORD, "wrong-guess")
    adapter = RedisNotifyAdapter(url, cluster=True, connect_timeout=3.0)
    with pytest.raises(ConfigurationError) as raised:
        await adapter.connect()
    assert "wrong-guess" not in str(raised.value)
    assert f"127.0.0.1:{auth_cluster.live_nodes()[0].port}" in str(raised.value)
    await adapter.close()


async def test_a_sync_clients_publisher_authenticates_with_the_password_in_the_url(
    auth_cluster: LocalRedisCluster, prefix: str
) -> None:
    types = [f"type-{index}" for index in range(12)]  # spread over every master
    async with RedisNotifyAdapter(
        auth_cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
    ) as listener:
        rec = Recorder()
        await listener.listen_job_scheduled(types, rec)
        await publish_blocking(
            RedisNotifyAdapter(
                auth_cluster.url,
                prefix=prefix,
                cluster=True,
                connect_timeout=CLUSTER_CONNECT_TIMEOUT,
            ),
            types,
        )
        await rec.wait_for(len(types), within=5.0)
    auth_cluster.delete_prefix(prefix)


async def test_a_sync_clients_publisher_with_a_wrong_password_fails_without_showing_it(
    auth_cluster: LocalRedisCluster, prefix: str
) -> None:
    url = auth_cluster.url.replace(PASSWORD, "wrong-guess")
    with pytest.raises(RedisClusterException, match="username-password") as raised:
        await publish_blocking(RedisNotifyAdapter(url, prefix=prefix, cluster=True), ["job"])
    # What the sender thread's warning would print: the error and its traceback.
    assert "wrong-guess" not in "".join(traceback.format_exception(raised.value))
