"""Publishing to a Redis Cluster with a blocking client, for ``SyncClient``: the cluster
wire layout and the Lua scripts of ``RedisNotifyAdapter(cluster=True)``
(:mod:`~queuert_notify.notify.redis.cluster`; with ``wake="lists"``,
:mod:`~queuert_notify.notify.redis.lists`), from a thread instead of an event loop.

redis-py's cluster pipeline writes every queued command to its slot's master before
reading any reply, so no master waits for another's reply, however many a publish
involves. That pipeline refuses ``evalsha()`` and does not load scripts;
the scripts are therefore sent as plain ``EVALSHA`` commands routed to the master of
their keys' slot, and a master that lacks the script (restarted, ``SCRIPT FLUSH``)
gets it loaded and that one call sent again.
"""

from __future__ import annotations

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from queuert_notify.notify.payloads import encode_payload
from queuert_notify.notify.redis.cluster import (
    NOTIFY_JOBS_SCHEDULED_SHARDED,
    cluster_name,
    scheduled_by_slot,
)
from queuert_notify.notify.redis.lists_lines import ClusterKeys
from queuert_notify.notify.redis.lists_wire import token_pushes
from queuert_notify.notify.redis.shared import (
    PUSH_WAKE_TOKENS,
    blocking_connection_retry,
)
from state_adapters.notifications import NotificationBuffer

_TIMEOUT = 2.0
"""Seconds a connect or a reply may take (a publish runs off the application's threads)."""


class RedisClusterBlockingPublisher:
    """Sends what committed transactions owe to a Redis Cluster, all at once: the adapter's
    own script once per hash slot of the scheduled types (wake budgets, then the ``sched``
    SPUBLISHes; with ``lists=True`` the wake tokens instead), and the chain-completed and
    ownership-lost SPUBLISHes, each on the master of its slot.

    The cluster client connects at the first publish, on the sender thread: building it
    never waits for Redis, and a cluster that is down fails that publish alone (the next
    one connects again). Not thread-safe: one sender thread uses it."""

    def __init__(self, url: str, prefix: str, *, lists: bool = False) -> None:
        self._url = url
        self._prefix = prefix
        self._lists = lists
        self._cluster: RedisCluster | None = None
        self._script: Script | None = None

    def publish(self, notes: NotificationBuffer) -> None:
        if self._lists:
            calls = token_pushes(self._prefix, notes.scheduled, ClusterKeys())
        else:
            calls = scheduled_by_slot(self._prefix, notes.scheduled)
        messages = [
            self._message("chainc", "chain id", chain_id) for chain_id in notes.completed_chains
        ]
        messages += [self._message("owls", "job id", job_id) for job_id in notes.lost_jobs]
        cluster, script = self._connected()
        pipe = cluster.pipeline()  # type: ignore[no-untyped-call]
        for keys, args in calls:
            # Routed here: left to the pipeline, each EVALSHA would first cost a
            # COMMAND GETKEYS round trip to learn its keys.
            node = cluster.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, target_nodes=node)
        for channel, payload in messages:
            pipe.spublish(channel, payload)
        replies = pipe.execute(raise_on_error=False)
        for (keys, args), reply in zip(calls, replies[: len(calls)], strict=True):
            if isinstance(reply, NoScriptError):
                script(keys=keys, args=args)  # SCRIPT LOAD on every master, then EVALSHA
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
                raise reply

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    def _connected(self) -> tuple[RedisCluster, Script]:
        """The cluster client (connected now if it is not yet) and the script this
        publisher runs, registered on it."""
        if self._cluster is None or self._script is None:
            cluster = RedisCluster.from_url(
                self._url,
                socket_timeout=_TIMEOUT,
                socket_connect_timeout=_TIMEOUT,
                retry=blocking_connection_retry(),
            )
            text = PUSH_WAKE_TOKENS if self._lists else NOTIFY_JOBS_SCHEDULED_SHARDED
            self._cluster, self._script = cluster, cluster.register_script(text)
        return self._cluster, self._script

    def _message(self, kind: str, what: str, value: str) -> tuple[str, str]:
        """The shard channel and payload of a message about one chain or job."""
        payload = encode_payload(what, value)
        return cluster_name(self._prefix, kind, payload), payload
