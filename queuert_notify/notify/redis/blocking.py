"""Publishing to Redis with a blocking client, for ``SyncClient``: the wire layout and
the Lua script of ``RedisNotifyAdapter``, from a thread instead of an event loop."""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import sha1
from typing import cast

from redis import Redis
from redis.connection import Connection
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

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


Command = tuple[str | int, ...]


class RedisBlockingPublisher:
    """Sends what committed transactions owe to one Redis server in one round trip:
    the wake budgets and ``sched`` messages through the adapter's own script, then the
    chain-completed and ownership-lost messages, pipelined. With ``lists=True`` the
    scheduled types get wake tokens pushed instead (``RedisNotifyAdapter(wake="lists")``).
    Not thread-safe: one sender thread uses it.

    The commands go out on one connection the publisher holds, written and read
    directly rather than through the client's pipeline (a pool checkout, a retry
    wrapper and a ``SCRIPT EXISTS`` round trip before every script): the sender thread's
    Python holds the GIL while the application's next transaction runs. A script the
    server no longer has (a restart, ``SCRIPT FLUSH``) is sent by its text; a connection
    the server closed is opened again and the round trip sent once more.
    """

    def __init__(self, url: str, prefix: str, *, lists: bool = False) -> None:
        self._prefix = prefix
        self._lists = lists
        self._redis = Redis.from_url(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
        # Connected on the first publish: a Redis down at start-up is an outage like any.
        self._connection = cast(Connection, self._redis.connection_pool.make_connection())
        self._scripts = {
            _sha(script): script for script in (NOTIFY_JOBS_SCHEDULED, PUSH_WAKE_TOKENS)
        }
        self._schedule = _sha(NOTIFY_JOBS_SCHEDULED)
        self._push = _sha(PUSH_WAKE_TOKENS)

    def publish(self, notes: NotificationBuffer) -> None:
        commands = self._commands(notes)
        if not commands:
            return
        try:
            replies = self._round_trip(commands)
        except ConnectionError:
            # A connection the server closed (a restart, an idle timeout) is found
            # out on its next use: once more, on a new one.
            replies = self._round_trip(commands)
        retry = [
            ("EVAL", self._scripts[str(command[1])], *command[2:])
            for command, reply in zip(commands, replies, strict=True)
            if isinstance(reply, NoScriptError)
        ]
        if retry:
            replies = self._round_trip(retry)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply

    def close(self) -> None:
        self._connection.disconnect()  # type: ignore[no-untyped-call]
        self._redis.close()

    def _commands(self, notes: NotificationBuffer) -> list[Command]:
        scheduled = {
            encode_payload("type name", name): count
            for name, count in notes.scheduled.items()
            if check_count(count) > 0
        }
        commands: list[Command] = []
        if scheduled and self._lists:
            keys = []
            for name in scheduled:
                keys += [token_list_key(self._prefix, name), issued_key(self._prefix, name)]
            argv = [HINT_TTL_SECONDS, TOKEN_CAP, *scheduled.values()]
            commands.append(("EVALSHA", self._push, len(keys), *keys, *argv))
        elif scheduled:
            args: list[str | int] = [channel_name(self._prefix, "sched"), HINT_TTL_SECONDS]
            for name, count in scheduled.items():
                args += [name, count]
            keys = [hint_key(self._prefix, name) for name in scheduled]
            commands.append(("EVALSHA", self._schedule, len(keys), *keys, *args))
        chains = channel_name(self._prefix, "chainc")
        for chain_id in notes.completed_chains:
            commands.append(("PUBLISH", chains, encode_payload("chain id", chain_id)))
        owls = channel_name(self._prefix, "owls")
        for job_id in notes.lost_jobs:
            commands.append(("PUBLISH", owls, encode_payload("job id", job_id)))
        return commands

    def _round_trip(self, commands: Sequence[Command]) -> list[object]:
        """Every command written, then every reply read (an error reply as its
        exception, returned); the connection is dropped when a reply is missing."""
        connection = self._connection
        try:
            packed = connection.pack_commands(commands)  # type: ignore[no-untyped-call]
            connection.send_packed_command(packed, check_health=False)  # type: ignore[no-untyped-call]
            return [_reply(connection) for _ in commands]
        except BaseException:
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise


def _reply(connection: Connection) -> object:
    try:
        return connection.read_response()
    except ResponseError as error:
        return error


def _sha(script: str) -> str:
    return sha1(script.encode(), usedforsecurity=False).hexdigest()
