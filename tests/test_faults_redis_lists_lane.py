"""``RedisNotifyAdapter(wake="lists")``: the lane's blocking connection under faults —
dropped (the lane reconnects as a new client, and its nudges follow it), its moves
ended by a report while another report's nudge still retries, and a lane stopped while
its push is held back by a write pause."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import pytest
from redis.asyncio import Redis

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.redis import lists_wire
from queuert_notify.notify.redis.shared import token_list_key
from queuert_notify.testing import Recorder
from tests.support.queue_helpers import wait_until
from tests.support.redis_helpers import named
from tests.support.services import own_redis_server
from tests.support.tcp_proxy import TcpProxy
from tests.test_redis_wake_lists import _reporting

pytest_plugins = ["tests.support.redis_fixtures"]


async def _blocked_ids(admin: Redis, name: str | None = None) -> set[int]:
    """The ids of the clients (named ``name``, when given) waiting in a blocking move."""
    return {
        int(c["id"])
        for c in await admin.client_list()
        if (name is None or c.get("name") == name)
        and c.get("cmd") in ("blmove", "blmpop")
        and "b" in c["flags"]
    }


async def test_a_dropped_blocking_connection_is_replaced_and_nudged_as_the_new_client(
    redis: Redis, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's blocking connection is dropped (CLIENT KILL: a proxy, a timeout, a
    network blip). The lane notices (on_reconnect runs: poll now), reconnects as a new
    client, and a report that makes another type wanted ends its new blocking move at
    once: the unblock names the new connection (not when the move times out, put off
    here)."""
    monkeypatch.setattr(lists_wire, "BLOCK_TIMEOUT", 8.0)  # below the socket's timeout
    async with (
        RedisNotifyAdapter(redis_url, prefix=prefix, wake="lists") as producer,
        RedisNotifyAdapter(named(redis_url, prefix), prefix=prefix, wake="lists") as worker,
    ):
        reconnects = Recorder()
        worker.on_reconnect(reconnects)
        busy = await _reporting(worker, ["a"], 0)
        await _reporting(worker, ["b"], 1)
        await wait_until(lambda: _blocked_ids(redis, prefix), timeout=5)
        (dropped,) = await _blocked_ids(redis, prefix)

        await redis.client_kill_filter(_id=str(dropped))

        await reconnects.wait_for(2, within=5)  # lost, then restored

        async def blocking_again() -> bool:
            return bool(await _blocked_ids(redis, prefix) - {dropped})

        await wait_until(blocking_again, timeout=5)
        await worker.acknowledge_wakes(busy, 1)
        await producer.notify_jobs_scheduled({"a": 1})
        await busy.wait_for(1, within=4)


async def test_a_nudge_for_a_newer_move_is_not_lost_while_an_older_nudge_retries(
    redis: Redis, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote server (replies take a moment): a report ends the lane's blocking move
    while that move is being served (its unblock ends nothing, and is tried again a
    moment later); the lane's next move, on the types then wanted, is out before that
    try, when another report makes one more type wanted. That report's nudge ends the
    newer move at once (not when it times out, put off here)."""
    monkeypatch.setattr(lists_wire, "BLOCK_TIMEOUT", 8.0)  # below the socket's timeout
    proxy = await TcpProxy.in_front_of(redis_url)
    proxy.delay = 0.01
    async with (
        RedisNotifyAdapter(redis_url, prefix=prefix, wake="lists") as producer,
        RedisNotifyAdapter(
            named(proxy.url(redis_url), prefix), prefix=prefix, wake="lists"
        ) as worker,
    ):
        first = await _reporting(worker, ["a"], 2)
        second = await _reporting(worker, ["b"], 1)
        third = await _reporting(worker, ["c"], 0)
        await wait_until(lambda: _blocked_ids(redis, prefix), timeout=5)  # on a and b

        await producer.notify_jobs_scheduled({"a": 1})  # served at once; the reply is slow
        # b no longer wanted: ends the move being served (the unblock finds none).
        leaving = asyncio.create_task(worker.acknowledge_wakes(second, 0))
        await first.wait_for(1, within=5)  # the next move is out, on a alone
        await worker.acknowledge_wakes(third, 1)  # c wanted: that move must end
        await leaving

        await producer.notify_jobs_scheduled({"c": 1})
        await third.wait_for(1, within=4)
    await proxy.close()


async def test_a_lane_stopped_while_its_push_is_held_back_by_a_write_pause_keeps_the_token(
    tmp_path: Path,
) -> None:
    """A manual failover pauses writes just after the lane's BLMPOP took a token, so the
    RPUSH into its processing list waits (a private server: CLIENT PAUSE WRITE). The lane
    stops meanwhile (its listener of the type leaves): the push is not refused (on Redis
    7.0 a refused command still runs once writes resume: one more token each time); once
    writes resume, the one token goes back to its list."""
    for server in own_redis_server(tmp_path):
        admin = Redis.from_url(server.url, decode_responses=True)
        try:
            async with RedisNotifyAdapter(server.url, prefix="p", wake="lists") as worker:
                leave = await worker.listen_job_scheduled(["a", "b"], Recorder())
                await worker.listen_job_scheduled(["a"], Recorder())  # the lane stays
                await wait_until(partial(_blocked_ids, admin), timeout=5)
                async with admin.pipeline(transaction=False) as pipe:
                    pipe.rpush(token_list_key("p", "b"), "1")  # the BLMPOP takes it
                    pipe.client_pause(60_000, all=False)  # before its RPUSH comes
                    await pipe.execute()
                await wait_until(partial(_held_back, admin, "rpush"), timeout=5)

                leaving = asyncio.create_task(leave())
                await asyncio.sleep(0.3)  # the lane stops meanwhile
                await admin.client_unpause()
                await leaving

                assert await admin.llen(token_list_key("p", "b")) == 1
        finally:
            await admin.client_unpause()
            await admin.aclose()


async def _held_back(admin: Redis, command: str) -> bool:
    """Whether a ``command`` waits for a write pause to end."""
    clients = await admin.client_list()
    return any(c.get("cmd") == command and "b" in c["flags"] for c in clients)
