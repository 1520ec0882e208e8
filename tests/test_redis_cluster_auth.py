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
    LocalRedisCluster,
    local_redis_cluster,
    sync_publisher_reaches_every_master,
    url_adapter_hears_every_master,
)
from tests.support.redis_helpers import publish_blocking

# The module's cluster with a password (module scope) is started once: one xdist worker
# runs every test of the module.
pytestmark = pytest.mark.xdist_group(__name__)

PASSWORD = "s3cret-cluster"


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """This module's cluster requires ``PASSWORD`` (``cluster`` in conftest.py serves it)."""
    yield from local_redis_cluster(tmp_path_factory.mktemp("redis-cluster-auth"), PASSWORD)


async def test_a_password_in_the_url_reaches_every_subscriber_connection(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    await url_adapter_hears_every_master(cluster, prefix)


async def test_a_caller_owned_client_gets_its_password_reused_for_the_subscribers(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    client = RedisCluster.from_url(cluster.url)
    try:
        async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_chain_completed("c", rec)
            await adapter.notify_chain_completed("c")
            await rec.wait_for(1, within=5.0)
    finally:
        await client.aclose()


async def test_a_wrong_password_fails_connect_without_showing_it(
    cluster: LocalRedisCluster,
) -> None:
    url = cluster.url.replace(PASSWORD, "wrong-guess")
    adapter = RedisNotifyAdapter(url, cluster=True, connect_timeout=3.0)
    with pytest.raises(ConfigurationError) as raised:
        await adapter.connect()
    assert "wrong-guess" not in str(raised.value)
    assert f"127.0.0.1:{cluster.live_nodes()[0].port}" in str(raised.value)
    await adapter.close()


async def test_a_sync_clients_publisher_authenticates_with_the_password_in_the_url(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    await sync_publisher_reaches_every_master(cluster, prefix)


async def test_a_sync_clients_publisher_with_a_wrong_password_fails_without_showing_it(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    url = cluster.url.replace(PASSWORD, "wrong-guess")
    with pytest.raises(RedisClusterException, match="username-password") as raised:
        await publish_blocking(RedisNotifyAdapter(url, prefix=prefix, cluster=True), ["job"])
    # What the sender thread's warning would print: the error and its traceback.
    assert "wrong-guess" not in "".join(traceback.format_exception(raised.value))
