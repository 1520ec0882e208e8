"""RedisNotifyAdapter on a Redis Cluster that speaks only TLS (clients, replication and
the cluster bus): the subscriber's own per-master connections use TLS like the cluster
client, whether the adapter was given a ``rediss://`` URL or a caller-owned client, and
so does SyncClient's blocking publisher (from the URL).

The nodes have no plaintext port, so every delivery below crossed a TLS connection.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from queuert_notify import ConfigurationError, RedisNotifyAdapter
from queuert_notify.testing import Recorder
from tests.support.redis_cluster import (
    ClusterConformance,
    LocalRedisCluster,
    local_redis_cluster,
    sync_publisher_reaches_every_master,
    url_adapter_hears_every_master,
)

# The module's TLS cluster (module scope) is started once: one xdist worker
# runs every test of the module.
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """This module's cluster is a TLS one (``cluster`` in conftest.py serves it)."""
    yield from local_redis_cluster(tmp_path_factory.mktemp("redis-cluster-tls"), tls=True)


def _tls_client(cluster: LocalRedisCluster) -> RedisCluster:
    """A cluster client built from keyword arguments, as an application would."""
    assert cluster.tls is not None
    node = cluster.live_nodes()[0]
    return RedisCluster(
        host="127.0.0.1", port=node.port, ssl=True, ssl_ca_certs=str(cluster.tls.ca_cert)
    )


class TestRedisClusterOverTls(ClusterConformance):
    """The conformance suite: ``adapter`` from a ``rediss://`` URL, ``peer_adapter`` on
    a caller-owned TLS client."""

    def peer_client(self, cluster: LocalRedisCluster) -> RedisCluster:
        return _tls_client(cluster)


async def test_a_rediss_url_subscribes_on_every_master_over_tls(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    assert cluster.url.startswith("rediss://")
    await url_adapter_hears_every_master(cluster, prefix)


async def test_a_sync_clients_publisher_reaches_every_master_over_tls_from_the_url(
    cluster: LocalRedisCluster, prefix: str
) -> None:
    assert cluster.url.startswith("rediss://")
    await sync_publisher_reaches_every_master(cluster, prefix)


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
            assert cluster.subscribers_per_master() == [1, 1, 1]
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
