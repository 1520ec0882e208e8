"""Publishing to Redis with a blocking client, for ``SyncClient``: the wire layout and
the Lua script of ``RedisNotifyAdapter``, from a thread instead of an event loop."""

from __future__ import annotations

from redis import Redis

from queuert_notify.notify.payloads import check_count, encode_payload
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.redis.lists_wire import TOKEN_CAP
from queuert_notify.notify.redis.shared import (
    NOTIFY_JOBS_SCHEDULED,
    PUSH_WAKE_TOKENS,
    channel_name,
    hint_key,
    issued_key,
    token_list_key,
)
from state_adapters.notifications import NotificationBuffer

_TIMEOUT = 2.0
"""Seconds a publish may wait for Redis (it runs off the application's threads)."""


class RedisBlockingPublisher:
    """Sends what committed transactions owe to one Redis server in one round trip:
    the wake budgets and ``sched`` messages through the adapter's own script, then the
    chain-completed and ownership-lost messages, pipelined. With ``lists=True`` the
    scheduled types get wake tokens pushed instead (``RedisNotifyAdapter(wake="lists")``).
    Not thread-safe: one sender thread uses it."""

    def __init__(self, url: str, prefix: str, *, lists: bool = False) -> None:
        self._prefix = prefix
        self._lists = lists
        self._redis = Redis.from_url(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
        self._schedule = self._redis.register_script(NOTIFY_JOBS_SCHEDULED)
        self._push = self._redis.register_script(PUSH_WAKE_TOKENS)

    def publish(self, notes: NotificationBuffer) -> None:
        scheduled = {
            encode_payload("type name", name): count
            for name, count in notes.scheduled.items()
            if check_count(count) > 0
        }
        pipe = self._redis.pipeline(transaction=False)
        if scheduled and self._lists:
            keys = []
            for name in scheduled:
                keys += [token_list_key(self._prefix, name), issued_key(self._prefix, name)]
            self._push(
                keys=keys, args=[HINT_TTL_SECONDS, TOKEN_CAP, *scheduled.values()], client=pipe
            )
        elif scheduled:
            args: list[str | int] = [channel_name(self._prefix, "sched"), HINT_TTL_SECONDS]
            for name, count in scheduled.items():
                args += [name, count]
            keys = [hint_key(self._prefix, name) for name in scheduled]
            self._schedule(keys=keys, args=args, client=pipe)
        for chain_id in notes.completed_chains:
            pipe.publish(channel_name(self._prefix, "chainc"), encode_payload("chain id", chain_id))
        for job_id in notes.lost_jobs:
            pipe.publish(channel_name(self._prefix, "owls"), encode_payload("job id", job_id))
        pipe.execute()

    def close(self) -> None:
        self._redis.close()
