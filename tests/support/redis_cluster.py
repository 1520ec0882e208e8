"""A real Redis Cluster on loopback ports, started by the tests themselves (no Docker).

Six ``redis-server --cluster-enabled yes`` processes (three masters, one
replica each) joined with ``redis-cli --cluster create``. Every node has its own
directory, client port and cluster-bus port, all picked free on 127.0.0.1, so
the shared Redis on 6379 is never touched. Tests may kill and restart nodes,
fail masters over to their replicas and move slots; each such helper returns
only when every live node reports ``cluster_state:ok`` and agrees on the slot
map, so the next step starts from a settled cluster. With ``tls`` every node
speaks only TLS, to clients, replicas and the cluster bus alike.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.redis.adapter import WakeMode
from queuert_notify.testing import NotifyAdapterConformance, Recorder
from queuert_notify.testing.notify_conformance import ForceReconnect
from tests.support.redis_helpers import publish_blocking
from tests.support.services import free_port, wait_for_port

NODE_TIMEOUT_MS = 1000  # failure detection; a failover takes about two of these
_SETTLE_TIMEOUT = 30.0
_POLL = 0.05  # interval of the settle loops; a cluster has no event to wait on


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""

    ca_cert: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, workdir: Path) -> TlsFiles:
        """Generate the files with the ``openssl`` command line (EC keys: fast)."""
        files = cls(workdir / "ca.crt", workdir / "server.crt", workdir / "server.key")
        ca_key, request, extensions = (workdir / n for n in ("ca.key", "server.csr", "san.cnf"))
        extensions.write_text("subjectAltName=IP:127.0.0.1\n")
        new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for argv in (
            ["req", "-x509", *new_key, "-keyout", ca_key, "-out", files.ca_cert,
             "-days", "2", "-subj", "/CN=queuert-notify test CA"],
            ["req", "-new", *new_key, "-keyout", files.key, "-out", request,
             "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", request, "-CA", files.ca_cert, "-CAkey", ca_key,
             "-CAcreateserial", "-out", files.cert, "-days", "2", "-extfile", extensions],
        ):  # fmt: skip
            subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
        return files

    def server_args(self) -> list[str]:
        """redis-server options: TLS only, for clients, replication and the cluster bus."""
        return [
            "--tls-cert-file", str(self.cert),
            "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca_cert),
            "--tls-auth-clients", "no",
            "--tls-replication", "yes",
            "--tls-cluster", "yes",
        ]  # fmt: skip


CLUSTER_CONNECT_TIMEOUT = 30.0
"""The tests' ``connect_timeout`` for a cluster adapter: its connect discovers the cluster
and loads the scripts on every master, which took over the default 5 s in a full run at
load 14 on two cores (a test of connecting is not what those tests are)."""


@dataclass
class ClusterNode:
    """One redis-server process of the cluster; it keeps its port and config across restarts."""

    port: int
    bus_port: int
    workdir: Path
    password: str | None = None
    tls: TlsFiles | None = None
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False  # SIGSTOPped: its sockets stay open, it answers nothing

    @property
    def answering(self) -> bool:
        return self.alive and not self.paused

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        argv = [
            "redis-server",
            *ports,
            "--cluster-port", str(self.bus_port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{self.port}.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--save", "",
            "--appendonly", "no",
            "--repl-diskless-sync-delay", "0",  # replicas sync at once, not after 5 s
            # A replica counts as available (CLUSTER SLOTS) once its offset moved: the
            # master's replication PING moves it, every 10 s by default.
            "--repl-ping-replica-period", "1",
        ]  # fmt: skip
        if self.password is not None:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        with (self.workdir / "server.log").open("ab") as log:  # the child keeps its own copy
            self.process = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=log)
        try:
            wait_for_port(self.port, self.process)
        except RuntimeError as exc:  # it exited (a port taken meanwhile) or hangs
            self.kill()
            raise NodeDidNotStart(f"{exc}; see {self.workdir / 'server.log'}") from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
        self.paused = False

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def client(self) -> Redis:
        tls: dict[str, object] = {}
        if self.tls is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca_cert)}
        return Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2.0, **tls
        )


class NodeDidNotStart(RuntimeError):
    """A node's redis-server answered on no port (it could not bind one, most often)."""


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` free loopback ports, no two alike: the kernel may hand out the port it
    just gave for the next bind too (a node given one port twice aborted, its cluster
    bus port in use by itself)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class LocalRedisCluster:
    """Three masters with one replica each, on free loopback ports."""

    workdir: Path
    password: str | None = None  # every node requires it (clients and replication)
    tls: TlsFiles | None = None  # every node speaks only TLS
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A ``redis://`` (``rediss://`` trusting the test CA) URL of one live node:
        enough for a cluster client to find the rest."""
        auth = f":{self.password}@" if self.password is not None else ""
        address = self.live_nodes()[0].address
        if self.tls is not None:
            return f"rediss://{auth}{address}/?ssl_ca_certs={self.tls.ca_cert}"
        return f"redis://{auth}{address}"

    def adapter(self, prefix: str, **options: Any) -> RedisNotifyAdapter:
        """A cluster adapter from :attr:`url` with the tests' ``connect_timeout``
        (:data:`CLUSTER_CONNECT_TIMEOUT`); ``options`` are the adapter's others."""
        options.setdefault("connect_timeout", CLUSTER_CONNECT_TIMEOUT)
        return RedisNotifyAdapter(self.url, prefix=prefix, cluster=True, **options)

    def start(self, attempts: int = 3) -> None:
        """Six nodes on free ports, joined into a cluster. A port found free may be taken
        by another test process before its node binds it (seen in CI runs: `redis-cli
        --cluster create` failed for a whole module; a node aborted, its cluster bus
        port in use): then all six start again on other ports, ``attempts`` times at
        most."""
        for attempt in range(attempts):
            try:
                created = self._create(self.workdir / f"attempt{attempt}")
            except NodeDidNotStart as exc:
                failure = str(exc)
            else:
                if created.returncode == 0:
                    self.wait_settled()
                    return
                failure = (created.stdout + created.stderr).decode(errors="replace").strip()
            self.stop()
            self.nodes.clear()
        raise RuntimeError(
            f"the cluster did not start in {attempts} attempts; the last: {failure[-2000:]}"
        )

    def _create(self, workdir: Path) -> subprocess.CompletedProcess[bytes]:
        ports = _distinct_free_ports(12)
        for index in range(6):
            node_dir = workdir / f"node{index}"
            node_dir.mkdir(parents=True)
            port, bus_port = ports[2 * index : 2 * index + 2]
            node = ClusterNode(port, bus_port, node_dir, self.password, self.tls)
            self.nodes.append(node)
            node.start()
        create = ["redis-cli", "--cluster", "create", *(node.address for node in self.nodes)]
        auth = ["-a", self.password, "--no-auth-warning"] if self.password is not None else []
        if self.tls is not None:
            auth += ["--tls", "--cacert", str(self.tls.ca_cert)]
        return subprocess.run(
            [*create, "--cluster-replicas", "1", "--cluster-yes", *auth],
            capture_output=True,
            timeout=60,
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def live_nodes(self) -> list[ClusterNode]:
        """Nodes that run and answer (neither killed nor paused)."""
        return [node for node in self.nodes if node.answering]

    # -- topology ------------------------------------------------------------

    def slot_owner(self, slot: int) -> int:
        """The port of the master serving ``slot``, as a live node reports it."""
        for start, end, master, *_ in self._cluster_slots():
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise LookupError(f"slot {slot} is not served by any node")

    def owner_of(self, name: str) -> int:
        """The port of the master serving the slot of key or shard channel ``name``."""
        return self.slot_owner(key_slot(name.encode()))

    def name_on(self, port: int, key_of: Callable[[str], str], skip: int = 0) -> str:
        """A type name ("type-N") whose key ``key_of(name)`` lives on master ``port``;
        ``skip`` passes over that many such names first."""
        index = 0
        while True:
            name = f"type-{index}"
            index += 1
            if self.owner_of(key_of(name)) == port:
                if skip == 0:
                    return name
                skip -= 1

    def names_on_every_master(self, key_of: Callable[[str], str], per_master: int) -> list[str]:
        """Type names ("type-N") whose keys ``key_of(name)`` spread over every master,
        ``per_master`` on each."""
        wanted = dict.fromkeys(self.masters(), per_master)
        names: list[str] = []
        index = 0
        while any(wanted.values()):
            name = f"type-{index}"
            index += 1
            owner = self.owner_of(key_of(name))
            if wanted[owner]:
                wanted[owner] -= 1
                names.append(name)
        return names

    def masters(self) -> list[int]:
        """Ports of the masters that serve at least one slot."""
        return sorted({int(entry[2][1]) for entry in self._cluster_slots()})

    def replica_of(self, master_port: int) -> int:
        for _, _, master, *replicas in self._cluster_slots():
            if int(master[1]) == master_port and replicas:
                return int(replicas[0][1])
        raise LookupError(f"master {master_port} has no replica")

    def _cluster_slots(self) -> list[list[object]]:
        for node in self.live_nodes():
            with suppress(RedisError), node.client() as client:
                return list(client.execute_command("CLUSTER SLOTS"))
        raise RuntimeError("no live cluster node answers CLUSTER SLOTS")

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``{prefix}:`` on every master (never FLUSHALL)."""
        for port in self.masters():
            with self.node(port).client() as client:
                keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
                for key in keys:  # one by one: the keys of a master span many slots
                    client.delete(key)

    def command_calls(self, port: int) -> dict[str, int]:
        """How often node ``port`` ran each command (INFO commandstats)."""
        with self.node(port).client() as client:
            stats = client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def shard_subscriber_connections(self, port: int) -> int:
        """Client connections of node ``port`` subscribed to at least one shard channel."""
        with self.node(port).client() as client:
            return sum(1 for entry in client.client_list() if int(entry.get("ssub", 0)) > 0)

    def subscribers_per_master(self) -> list[int]:
        """:meth:`shard_subscriber_connections` of each master, by port."""
        return [self.shard_subscriber_connections(port) for port in self.masters()]

    def blocked_movers(self, port: int) -> int:
        """Client connections of node ``port`` blocked in ``BLMOVE``/``BLMPOP`` right now."""
        with self.node(port).client() as client:
            return sum(
                1
                for entry in client.client_list()
                if entry.get("cmd") in ("blmove", "blmpop") and "b" in str(entry.get("flags"))
            )

    # -- faults ------------------------------------------------------------------

    def kill_shard_subscribers(self) -> int:
        """CLIENT KILL every connection subscribed to a shard channel, on every master
        (the servers stay up); returns how many. The cluster is this module's own."""
        killed = 0
        for port in self.masters():
            with self.node(port).client() as client:
                for entry in client.client_list():
                    if int(entry.get("ssub", 0)) > 0:
                        client.client_kill_filter(_id=entry["id"])
                        killed += 1
        return killed

    def kill(self, port: int) -> None:
        """SIGKILL node ``port`` (the cluster notices within about ``NODE_TIMEOUT_MS``)."""
        self.node(port).kill()

    def pause(self, port: int) -> None:
        """SIGSTOP node ``port``: like a network partition, its connections stay open
        but nothing answers; the cluster fails it over like a dead node."""
        self.node(port).pause()

    def resume(self, port: int) -> None:
        """SIGCONT a paused node and wait until it rejoined (a former master as replica)."""
        self.node(port).resume()
        self.wait_settled()

    def kill_master_and_wait_for_failover(self, port: int) -> int:
        """SIGKILL master ``port``; return the port of the replica that took over its slots."""
        replica = self.replica_of(port)
        self.kill(port)
        return self.wait_for_failover(port, replica)

    def wait_for_failover(self, dead_master: int, replica: int) -> int:
        """Wait until ``replica`` serves the slots of ``dead_master`` and the cluster settled."""
        deadline = time.monotonic() + _SETTLE_TIMEOUT
        while dead_master in self._masters_seen_by_all() and time.monotonic() < deadline:
            time.sleep(_POLL)
        self.wait_settled()
        assert replica in self.masters(), f"replica {replica} did not take over from {dead_master}"
        return replica

    def settle(self, prefix: str) -> None:
        """Undo a fault test: resume paused nodes, restart killed ones (a former master
        rejoins as a replica), delete the test's keys."""
        for node in self.nodes:
            if node.paused:
                self.resume(node.port)
            if not node.alive:
                self.restart(node.port)
        self.delete_prefix(prefix)

    def restart(self, port: int) -> None:
        """Start a killed node again with its config: it rejoins (a former master as replica)."""
        node = self.node(port)
        node.kill()
        node.start()
        self.wait_settled()

    def move_slot(self, slot: int, to_port: int) -> None:
        """Move ``slot`` (and its keys) to master ``to_port`` the way ``redis-cli`` reshards:
        IMPORTING/MIGRATING, MIGRATE of every key, then SETSLOT NODE on every master."""
        from_port = self.slot_owner(slot)
        if from_port == to_port:
            return
        source, target = self.node(from_port).client(), self.node(to_port).client()
        with source, target:
            source_id = source.execute_command("CLUSTER MYID").decode()
            target_id = target.execute_command("CLUSTER MYID").decode()
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                auth = ["AUTH", self.password] if self.password is not None else []
                source.execute_command(
                    "MIGRATE", "127.0.0.1", to_port, "", 0, 5000, *auth, "KEYS", *keys
                )
            # Target first, then source, then the other masters: the documented order.
            target.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            source.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            for port in self.masters():
                if port not in (from_port, to_port):
                    with self.node(port).client() as other:
                        other.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        self.wait_settled()

    # -- settling ----------------------------------------------------------------

    def wait_settled(self) -> None:
        """Return once every live node says ``cluster_state:ok``, all agree on who
        serves which slot, and every live replica has synced with its master."""
        deadline = time.monotonic() + _SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            if self._settled():
                return
            time.sleep(_POLL)
        raise RuntimeError(f"the local Redis Cluster did not settle in {_SETTLE_TIMEOUT}s")

    def _settled(self) -> bool:
        views: list[list[tuple[int, ...]]] = []
        for node in self.live_nodes():
            try:
                with node.client() as client:
                    info = client.execute_command("CLUSTER INFO")  # parsed into a dict
                    if info.get("cluster_state") != "ok":
                        return False
                    slots = client.execute_command("CLUSTER SLOTS")
            except RedisError:
                return False
            # CLUSTER SLOTS lists a replica only once it has synced with its master.
            views.append(sorted(tuple(int(n[1]) for n in nodes) for _, _, *nodes in slots))
        listed = {port for view in views[:1] for entry in view for port in entry}
        every_live_node_serves = listed == {node.port for node in self.live_nodes()}
        return every_live_node_serves and all(view == views[0] for view in views)

    def _masters_seen_by_all(self) -> set[int]:
        seen: set[int] = set()
        for node in self.live_nodes():
            with suppress(RedisError), node.client() as client:
                seen |= {int(entry[2][1]) for entry in client.execute_command("CLUSTER SLOTS")}
        return seen


class ClusterConformance(NotifyAdapterConformance):
    """The notify conformance suite on the test module's cluster (the ``cluster``
    fixture): ``adapter`` from its URL, ``peer_adapter`` on a caller-owned client
    (:meth:`peer_client`), so both ways of building an adapter are exercised; a
    reconnect is forced by killing the shard subscribers' connections."""

    wake: WakeMode = "pubsub"

    def peer_client(self, cluster: LocalRedisCluster) -> RedisCluster:
        return RedisCluster.from_url(cluster.url)

    @pytest.fixture
    async def adapter(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[RedisNotifyAdapter]:
        async with cluster.adapter(prefix, wake=self.wake) as adapter:
            yield adapter

    @pytest.fixture
    async def force_reconnect(self, cluster: LocalRedisCluster) -> AsyncIterator[ForceReconnect]:
        async def kill_subscribers() -> None:
            assert await asyncio.to_thread(cluster.kill_shard_subscribers) > 0

        yield kill_subscribers

    @pytest.fixture
    async def peer_adapter(
        self, cluster: LocalRedisCluster, prefix: str
    ) -> AsyncIterator[RedisNotifyAdapter]:
        client = self.peer_client(cluster)
        try:
            async with RedisNotifyAdapter(client=client, prefix=prefix, wake=self.wake) as peer:
                yield peer
        finally:
            await client.aclose()


SPREAD_TYPES = [f"type-{index}" for index in range(12)]
"""Type names whose wake channels land on every master of a three-master cluster."""


async def url_adapter_hears_every_master(cluster: LocalRedisCluster, prefix: str) -> None:
    """An adapter made from ``cluster.url`` hears its own announcements of types on every
    master through one subscriber connection per master, and takes their budgets."""
    async with cluster.adapter(prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(SPREAD_TYPES, rec)
        await adapter.notify_jobs_scheduled(dict.fromkeys(SPREAD_TYPES, 1))
        await rec.wait_for(len(SPREAD_TYPES), within=5.0)
        assert sorted(call[0] for call in rec.calls) == sorted(SPREAD_TYPES)
        assert cluster.subscribers_per_master() == [1, 1, 1]
        assert await adapter.consume_wake_hint(SPREAD_TYPES[0]) is True
        assert await adapter.consume_wake_hint(SPREAD_TYPES[0]) is False


async def sync_publisher_reaches_every_master(cluster: LocalRedisCluster, prefix: str) -> None:
    """SyncClient's blocking publisher, made from ``cluster.url``, reaches a listener of
    types on every master."""
    async with cluster.adapter(prefix) as listener:
        rec = Recorder()
        await listener.listen_job_scheduled(SPREAD_TYPES, rec)
        await publish_blocking(cluster.adapter(prefix), SPREAD_TYPES)
        await rec.wait_for(len(SPREAD_TYPES), within=5.0)
        assert sorted(call[0] for call in rec.calls) == sorted(SPREAD_TYPES)


def local_redis_cluster(
    workdir: Path, password: str | None = None, *, tls: bool = False
) -> Iterator[LocalRedisCluster]:
    """Start a local cluster in ``workdir`` (with ``tls``: TLS only, on certificates of
    its own); skip (fail under CI=true) when the Redis binaries, or for TLS the
    ``openssl`` command or redis-server's TLS support, are missing; kill every node
    afterwards."""
    binaries = ("redis-server", "redis-cli", *(("openssl",) if tls else ()))
    missing = [binary for binary in binaries if shutil.which(binary) is None]
    reason = None
    if missing:
        reason = f"{', '.join(missing)} not installed; the Redis Cluster tests start their own"
    elif (version := _server_version()) < (7, 0):
        reason = f"redis-server {version} has no sharded Pub/Sub; Redis Cluster tests need 7.0+"
    elif tls and not _server_has_tls():
        reason = "this redis-server was built without TLS (BUILD_TLS=yes)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    cluster = LocalRedisCluster(workdir, password, TlsFiles.create(workdir) if tls else None)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _server_version() -> tuple[int, ...]:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"v=(\d+)\.(\d+)", out.stdout)
    return tuple(int(part) for part in match.groups()) if match else (0, 0)


def _server_has_tls() -> bool:
    """Whether redis-server was built with TLS: asked for a TLS port without a
    certificate, such a build refuses naming ``tls-cert-file``; one without TLS never
    looks for the file."""
    argv = ["redis-server", "--port", "0", "--tls-port", "1"]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:  # it started without TLS (and was killed)
        return False
    return "tls-cert-file" in probe.stdout + probe.stderr
