"""RedisNotifyAdapter on a Redis Cluster that speaks only TLS (clients, replication and
the cluster bus): the subscriber's own per-master connections use TLS like the cluster
client, whether the adapter was given a ``rediss://`` URL or a caller-owned client, and
so does SyncClient's blocking publisher (from the URL).

The nodes have no plaintext port, so every delivery below crossed a TLS connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from queuert_notify import ConfigurationError, RedisNotifyAdapter
from queuert_notify.testing import NotifyAdapterConformance, Recorder
from tests.support.redis_cluster import (
    CLUSTER_CONNECT_TIMEOUT,
    LocalRedisCluster,
    local_redis_cluster,
)
from tests.support.redis_helpers import publish_blocking

# The module's TLS cluster (module scope) is started once: one xdist worker
# runs every test of the module.
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    yield from local_redis_cluster(tmp_path_factory.mktemp("redis-cluster-tls"), tls=True)


@pytest.fixture
def cluster(tls_cluster: LocalRedisCluster, prefix: str) -> Iterator[LocalRedisCluster]:
    """The module's TLS cluster; this test's keys are deleted afterwards."""
    yield tls_cluster
    tls_cluster.delete_prefix(prefix)


def _tls_client(cluster: LocalRedisCluster) -> RedisCluster:
    """A cluster client built from keyword arguments, as an application would."""
    assert cluster.tls is not None
    node = cluster.live_nodes()[0]
    return RedisCluster(
        host="127.0.0.1", port=node.port, ssl=True, ssl_ca_certs=str(cluster.tls.ca_cert)
    )


def _subscribers_per_master(cluster: LocalRedisCluster) -> list[int]:
    return [cluster.shard_subscriber_connections(port) for port in cluster.masters()]


class TestRedisClusterOverTls(NotifyAdapterConformance):
    """The conformance suite: ``adapter`` from a ``rediss://`` URL, ``peer_adapter`` on
    a caller-owned TLS client."""

    @pytest.fixture
    async def adapter(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[RedisNotifyAdapter]:
        async with RedisNotifyAdapter(
            cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
        ) as adapter:
            yield adapter

    @pytest.fixture
    async def peer_adapter(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[RedisNotifyAdapter]:
        client = _tls_client(cluster)
        try:
            async with RedisNotifyAdapter(client=client, prefix=prefix) as peer:
                yield peer
        finally:
            await client.aclose()


async def test_a_rediss_url_subscribes_on_every_master_over_tls(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    assert cluster.url.startswith("rediss://")
    async with RedisNotifyAdapter(
        cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
    ) as adapter:
        rec = Recorder()
        types = [f"type-{index}" for index in range(12)]  # spread over every master
        await adapter.listen_job_scheduled(types, rec)
        await adapter.notify_jobs_scheduled(dict.fromkeys(types, 1))
        await rec.wait_for(len(types), within=5.0)
        assert sorted(call[0] for call in rec.calls) == sorted(types)
        assert _subscribers_per_master(cluster) == [1, 1, 1]
        assert await adapter.consume_wake_hint(types[0]) is True
        assert await adapter.consume_wake_hint(types[0]) is False


async def test_a_sync_clients_publisher_reaches_every_master_over_tls_from_the_url(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    types = [f"type-{index}" for index in range(12)]  # spread over every master
    async with RedisNotifyAdapter(
        cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
    ) as listener:
        rec = Recorder()
        await listener.listen_job_scheduled(types, rec)
        await publish_blocking(
            RedisNotifyAdapter(
                cluster.url, prefix=prefix, cluster=True, connect_timeout=CLUSTER_CONNECT_TIMEOUT
            ),
            types,
        )
        await rec.wait_for(len(types), within=5.0)
        assert sorted(call[0] for call in rec.calls) == sorted(types)


async def test_a_caller_owned_tls_client_lends_its_tls_settings_to_the_subscribers(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    client = _tls_client(cluster)
    try:
        async with RedisNotifyAdapter(client=client, prefix=prefix) as adapter:
            rec = Recorder()
            chains = [f"chain-{index}" for index in range(12)]
            for chain in chains:
                await adapter.listen_chain_completed(chain, rec)
            for chain in chains:
                await adapter.notify_chain_completed(chain)
            await rec.wait_for(len(chains), within=5.0)
            assert _subscribers_per_master(cluster) == [1, 1, 1]
    finally:
        await client.aclose()


async def test_a_server_certificate_from_an_untrusted_ca_fails_connect_naming_the_address(
    cluster: LocalRedisCluster,
) -> None:
    url = cluster.url.partition("/?")[0]  # no ssl_ca_certs: the system CAs do not trust it
    adapter = RedisNotifyAdapter(url, cluster=True, connect_timeout=3.0)
    with pytest.raises(ConfigurationError) as raised:
        await adapter.connect()
    assert f"127.0.0.1:{cluster.live_nodes()[0].port}" in str(raised.value)
    assert "certificate" in str(raised.value)
    await adapter.close()
