"""``RedisNotifyAdapter(wake="lists")``: one token wakes one consumer, tokens wait for a
consumer with a free slot, are acknowledged after the claim, capped, and expire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from queuert_notify import RedisNotifyAdapter
from queuert_notify.errors import ConfigurationError
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.redis import lists_listeners, lists_wire
from queuert_notify.notify.redis.lists_wire import TOKEN_CAP
from queuert_notify.notify.redis.shared import (
    channel_name,
    consumers_key,
    issued_key,
    processing_key,
    token_list_key,
)
from queuert_notify.testing import Recorder
from tests.support.queue_helpers import wait_until
from tests.support.redis_helpers import named
from tests.support.services import own_redis_server

pytest_plugins = ["tests.support.redis_fixtures"]


@pytest.fixture
async def adapters(redis_url: str, prefix: str) -> AsyncIterator[list[RedisNotifyAdapter]]:
    opened = [RedisNotifyAdapter(redis_url, prefix=prefix, wake="lists") for _ in range(3)]
    for adapter in opened:
        await adapter.connect()
    yield opened
    for adapter in opened:
        await adapter.close()


@pytest.mark.parametrize(
    "options",
    [{"wake": "stream"}, {"consumer_timeout": 0}],
)
def test_a_wake_mode_other_than_pubsub_or_lists_is_a_configuration_error(
    redis_url: str, options: dict[str, object]
) -> None:
    with pytest.raises(ConfigurationError):
        RedisNotifyAdapter(redis_url, **options)  # type: ignore[arg-type]


async def test_one_token_wakes_exactly_one_of_several_listening_adapters(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer, *listeners = adapters
    heard = Recorder()
    for listener in listeners:
        await listener.listen_job_scheduled(["t"], heard)

    await producer.notify_jobs_scheduled({"t": 1})
    await heard.wait_for(1, within=5)
    await asyncio.sleep(0.3)  # a second wake would arrive now

    assert heard.calls == [("t",)]
    assert await redis.llen(token_list_key(prefix, "t")) == 0


async def test_a_listener_without_free_slots_leaves_tokens_to_others(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer, busy, idle = adapters
    busy_heard, idle_heard = Recorder(), Recorder()
    await busy.listen_job_scheduled(["t"], busy_heard)
    await busy.acknowledge_wakes(busy_heard, 0)  # a worker whose slots are all taken

    await producer.notify_jobs_scheduled({"t": 2})
    await asyncio.sleep(0.3)
    assert busy_heard.calls == []
    assert await redis.llen(token_list_key(prefix, "t")) == 2, "the tokens wait"

    await idle.listen_job_scheduled(["t"], idle_heard)
    await idle_heard.wait_for(2, within=5)
    await busy.acknowledge_wakes(busy_heard, 1)  # a slot freed: nothing left to take
    await asyncio.sleep(0.2)
    assert busy_heard.calls == []


@pytest.fixture
async def watched(redis_url: str, prefix: str) -> AsyncIterator[RedisNotifyAdapter]:
    """A lists-mode adapter whose connections carry the test's ``prefix`` as their name
    (to find its blocking move in CLIENT LIST: the server is shared)."""
    adapter = RedisNotifyAdapter(named(redis_url, prefix), prefix=prefix, wake="lists")
    await adapter.connect()
    yield adapter
    await adapter.close()


async def _blocking(redis: Redis, prefix: str) -> bool:
    """Whether the ``watched`` adapter's consumer waits in a blocking move."""
    return any(
        c.get("name") == prefix and c.get("cmd") in ("blmove", "blmpop") and c.get("flags") == "b"
        for c in await redis.client_list()
    )


async def test_a_token_a_busy_listener_passed_over_is_offered_again_once_a_slot_is_free(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer, worker, _ = adapters
    heard = await _heard_one(producer, worker, ["t", "u"], "u")
    # Heard while the worker's claim filled its one slot: it passed it over (it had no
    # slot). That pass ends with no slot free; the next, once the run ends, claims
    # anyway (its slot freed) and leaves the token held.
    await worker.acknowledge_wakes(heard, 0)
    await worker.acknowledge_wakes(heard, 1)

    await heard.wait_for(2, within=5)
    assert heard.calls == [("u",), ("u",)]
    assert await worker.consume_wake_hint("u") is True
    await worker.acknowledge_wakes(heard, 1)
    # Nothing held any more: the next token is moved and announced.
    await producer.notify_jobs_scheduled({"t": 1})
    await heard.wait_for(3, within=5)
    assert heard.calls[2] == ("t",)


async def test_a_token_heard_with_a_slot_free_is_not_announced_again_before_it_is_asked(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    """A token heard during a claim pass, with a slot free, is asked for by the next
    pass: the pass's acknowledgement must not announce it again, or the second ask
    would take a token another listener is waiting for."""
    producer, worker, other = adapters
    heard, other_heard = Recorder(), Recorder()
    await worker.listen_job_scheduled(["t"], heard)
    await worker.acknowledge_wakes(heard, 1)
    await other.listen_job_scheduled(["t"], other_heard)
    await other.acknowledge_wakes(other_heard, 0)
    await producer.notify_jobs_scheduled({"t": 1})
    await heard.wait_for(1, within=5)
    await producer.notify_jobs_scheduled({"t": 1})  # waits in the list: no one is free
    await wait_until(lambda: _length(redis, token_list_key(prefix, "t"), 1), timeout=5)

    await worker.acknowledge_wakes(heard, 1)  # the pass during which it was heard ends
    assert [await worker.consume_wake_hint("t") for _ in heard.calls] == [True]
    await worker.acknowledge_wakes(heard, 0)
    await other.acknowledge_wakes(other_heard, 1)

    await other_heard.wait_for(1, within=5)
    assert heard.calls == [("t",)]


async def test_a_listener_that_does_not_ask_is_not_woken_at_every_acknowledgement(
    adapters: list[RedisNotifyAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its wake budget calls fail, a worker counts every hint as granted without
    asking: a held token is announced to it again once, not after every pass (the look
    a while after a report, tested below, put off past the test)."""
    monkeypatch.setattr(lists_listeners, "ANNOUNCE_AGAIN_AFTER", 3600.0)
    producer, worker, _ = adapters
    heard = await _heard_one(producer, worker, ["t"], "t")
    await worker.acknowledge_wakes(heard, 1)
    await worker.acknowledge_wakes(heard, 1)
    await heard.wait_for(2, within=5)

    for _ in range(3):
        await worker.acknowledge_wakes(heard, 1)
    assert len(heard.calls) == 3  # every other pass at most, and each wakes one pass


async def test_a_token_a_listener_counted_as_granted_without_taking_it_is_announced_again(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    """A worker whose wake budget calls fail counts a hint as granted without asking:
    the token it heard with a slot free stays held, filling the free slots it reports.
    It is announced again a moment after that report (no later pass need come), and
    the next token waits for nothing once it is taken."""
    producer, worker, _ = adapters
    heard = Recorder()
    await worker.listen_job_scheduled(["t"], heard)
    await worker.acknowledge_wakes(heard, 2)
    await producer.notify_jobs_scheduled({"t": 1})
    await heard.wait_for(1, within=5)
    await worker.acknowledge_wakes(heard, 1)  # claimed its job, did not take the token
    await producer.notify_jobs_scheduled({"t": 1})  # held + granted = 1 = demand: it waits

    await heard.wait_for(2, within=10)
    assert await worker.consume_wake_hint("t") is True
    await worker.acknowledge_wakes(heard, 1)
    await heard.wait_for(3, within=10)
    assert await redis.llen(token_list_key(prefix, "t")) == 0


async def test_a_token_whose_acknowledgement_failed_is_counted_again_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acknowledgement's LREM refused (here by the user's ACL, a private server):
    the token stays in the processing list, counted nowhere. The lane counts its list
    again and adopts it (announced, consumed and acknowledged as any other), instead of
    every later consume that finds the list empty waiting for it as one in flight; at
    once, not when its blocking move next times out (put off here)."""
    monkeypatch.setattr(lists_wire, "BLOCK_TIMEOUT", 8.0)  # below the socket's timeout
    for server in own_redis_server(tmp_path):
        admin = Redis.from_url(server.url, decode_responses=True)
        await admin.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"],
                                channels=["*"], commands=["+@all"])  # fmt: skip
        worker_url = server.url.replace("redis://", "redis://worker:pw@")
        async with (
            RedisNotifyAdapter(server.url, prefix="p", wake="lists") as producer,
            RedisNotifyAdapter(worker_url, prefix="p", wake="lists") as worker,
        ):
            heard = await _heard_one(producer, worker, ["t"], "t")
            assert await worker.consume_wake_hint("t") is True
            await admin.acl_setuser("worker", commands=["-lrem"])
            with pytest.raises(NoPermissionError):
                await worker.acknowledge_wakes(heard, 1)
            await admin.acl_setuser("worker", commands=["+lrem"])

            await heard.wait_for(2, within=4)
            assert await worker.consume_wake_hint("t") is True
            await worker.acknowledge_wakes(heard, 1)
            (consumer,) = await admin.zrange(consumers_key("p", "t"), 0, -1)
            assert await admin.llen(processing_key("p", "t", consumer)) == 0
        await admin.aclose()


Private = tuple[Redis, RedisNotifyAdapter, RedisNotifyAdapter]


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[Private]:
    """On a private server (a test pauses its writes): an admin client, a producer and a
    worker adapter."""
    for server in own_redis_server(tmp_path):
        admin = Redis.from_url(server.url, decode_responses=True)
        async with (
            RedisNotifyAdapter(server.url, prefix="p", wake="lists") as producer,
            RedisNotifyAdapter(server.url, prefix="p", wake="lists") as worker,
        ):
            yield admin, producer, worker
            await admin.client_unpause()  # the adapters close without waiting for it
        await admin.aclose()


async def test_a_blocking_move_held_back_by_a_write_pause_is_ended_without_harm(
    private: Private,
) -> None:
    """A manual failover pauses writes, and a blocking move sent meanwhile is held back.
    A report that changes the types the lane waits on ends it (it moves nothing: Redis
    7.0 would still run it once writes resume, popping a token nobody hears of and
    sending its reply as the next command's, so its connection is dropped), the server
    carries on, and the lane waits on its types again once writes resume: no token is
    lost, and every reply the lane reads is its own command's."""
    admin, producer, worker = private
    busy, idle, held = await _a_move_held_back(admin, worker)

    await worker.acknowledge_wakes(busy, 0)  # a is not: the held back move is ended

    await wait_until(partial(_gone, admin, held), timeout=5)
    await admin.client_unpause()
    await producer.notify_jobs_scheduled({"a": 1, "b": 1})
    await idle.wait_for(1, within=5)
    assert busy.calls == []
    (consumer,) = await admin.zrange(consumers_key("p", "a"), 0, -1)
    assert await admin.llen(token_list_key("p", "a")) == 1  # not popped by the ended move
    assert await admin.llen(processing_key("p", "b", consumer)) == 1  # what idle heard
    assert await worker.consume_wake_hint("b") is True
    await worker.acknowledge_wakes(idle, 1)  # its slot is free again
    assert await admin.llen(processing_key("p", "b", consumer)) == 0
    await producer.notify_jobs_scheduled({"b": 1})
    await idle.wait_for(2, within=5)
    assert idle.calls == [("b",), ("b",)]
    assert await admin.llen(processing_key("p", "b", consumer)) == 1


async def test_a_held_back_move_unblocked_twice_loses_no_token_and_stays_in_step(
    private: Private,
) -> None:
    """Two unblocks of one held-back move (a nudge and another, or a stop's): Redis 7.0
    answers the second ``UNBLOCKED`` too, ahead of the lane's ``PING``. That answer is
    the move's end, not a reply of the server's own: the connection is dropped, no later
    command of the lane reads a reply meant for another, and every token is heard once."""
    admin, producer, worker = private
    busy, idle, held = await _a_move_held_back(admin, worker)

    await asyncio.gather(
        admin.client_unblock(held, error=True), admin.client_unblock(held, error=True)
    )

    await wait_until(partial(_gone, admin, held), timeout=5)
    await admin.client_unpause()
    await producer.notify_jobs_scheduled({"a": 1, "b": 1})
    await idle.wait_for(1, within=5)
    await busy.wait_for(1, within=5)
    (consumer,) = await admin.zrange(consumers_key("p", "a"), 0, -1)
    assert await admin.llen(processing_key("p", "a", consumer)) == 1
    assert await admin.llen(processing_key("p", "b", consumer)) == 1
    assert await worker.consume_wake_hint("b") is True
    await worker.acknowledge_wakes(idle, 1)
    await producer.notify_jobs_scheduled({"b": 1})
    await idle.wait_for(2, within=5)
    assert idle.calls == [("b",), ("b",)]
    assert busy.calls == [("a",)]
    assert await admin.llen(processing_key("p", "b", consumer)) == 1


async def _a_move_held_back(
    admin: Redis, worker: RedisNotifyAdapter
) -> tuple[Recorder, Recorder, str]:
    """A busy listener of ``a`` and an idle one of ``b``; writes paused, then ``a``
    wanted too, so the lane's move is sent again and held back by the pause. Returns the
    two listeners and the held-back client's id."""
    busy = await _reporting(worker, ["a"], 0)
    idle = await _reporting(worker, ["b"], 1)
    await wait_until(partial(_blocked, admin, "blmove"), timeout=5)
    await admin.client_pause(60_000, all=False)
    await worker.acknowledge_wakes(busy, 1)  # a is wanted too: the move is sent again
    await wait_until(partial(_blocked, admin, "blmpop"), timeout=5)  # sent while paused
    [held] = [c["id"] for c in await admin.client_list() if c["cmd"] == "blmpop"]
    return busy, idle, held


async def _gone(admin: Redis, client_id: str) -> bool:
    """Whether the (private) server's client ``client_id`` is gone."""
    return all(c["id"] != client_id for c in await admin.client_list())


async def _blocked(admin: Redis, command: str) -> bool:
    """Whether a client of the (private) server is blocked in ``command``: on its keys,
    or held back by a pause."""
    return any(c["cmd"] == command and "b" in c["flags"] for c in await admin.client_list())


async def test_a_token_whose_removal_is_in_flight_is_not_adopted_by_a_recount(
    private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recount (here after another listener's acknowledgement was cancelled) while an
    acknowledgement's LREM is on its way (held back by CLIENT PAUSE WRITE, a private
    server) finds that token still in the processing list: it is not adopted, or its
    listener would be woken for a claim with nothing to claim. The recount runs at once,
    not when the blocking move next times out (put off here)."""
    monkeypatch.setattr(lists_wire, "BLOCK_TIMEOUT", 8.0)  # below the socket's timeout
    admin, producer, worker = private
    first = await _reporting(worker, ["t"], 1)
    second = await _reporting(worker, ["u"], 1)
    await producer.notify_jobs_scheduled({"t": 1, "u": 1})
    await first.wait_for(1, within=5)
    await second.wait_for(1, within=5)
    assert await worker.consume_wake_hint("t") is True
    await admin.client_pause(60_000, all=False)
    removing = asyncio.create_task(worker.acknowledge_wakes(first, 1))
    await wait_until(partial(_paused_removals, admin, 1), timeout=5)
    assert await worker.consume_wake_hint("u") is True
    cancelled = asyncio.create_task(worker.acknowledge_wakes(second, 1))
    await wait_until(partial(_paused_removals, admin, 2), timeout=5)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    # Whether u's removal is carried out is unknown: the recount adopts it.
    await second.wait_for(2, within=5)
    assert first.calls == [("t",)]
    await admin.client_unpause()
    await removing


async def _paused_removals(admin: Redis, expected: int) -> bool:
    clients = await admin.client_list()
    return sum(1 for c in clients if c.get("cmd") == "lrem" and "b" in c["flags"]) == expected


async def _heard_one(
    producer: RedisNotifyAdapter, worker: RedisNotifyAdapter, types: list[str], pushed: str
) -> Recorder:
    """A listener of ``types`` on ``worker`` with one slot free, once it heard of one
    token of ``pushed``."""
    heard = await _reporting(worker, types, 1)
    await producer.notify_jobs_scheduled({pushed: 1})
    await heard.wait_for(1, within=5)
    return heard


async def _length(redis: Redis, key: str, expected: int) -> bool:
    return int(await redis.llen(key)) == expected


async def test_a_token_moved_once_every_slot_is_spoken_for_goes_back_unannounced(
    adapters: list[RedisNotifyAdapter], watched: RedisNotifyAdapter, redis: Redis, prefix: str
) -> None:
    producer = adapters[0]
    heard = Recorder()
    await watched.listen_job_scheduled(["t", "u"], heard)
    await watched.acknowledge_wakes(heard, 2)
    await producer.notify_jobs_scheduled({"u": 1})
    await heard.wait_for(1, within=5)
    await wait_until(lambda: _blocking(redis, prefix), timeout=5)  # for a second token
    await watched.acknowledge_wakes(heard, 1)  # a slot was taken meanwhile: u fills the other

    await producer.notify_jobs_scheduled({"t": 1})

    # The blocking move took t all the same; it goes back to the head of its list, and u
    # stays with the listener that heard of it.
    async def one_given_back() -> bool:
        lengths = [await redis.llen(token_list_key(prefix, name)) for name in ("t", "u")]
        return sum(lengths) == 1

    await wait_until(one_given_back, timeout=5)
    assert await redis.llen(token_list_key(prefix, "t")) == 1
    assert await redis.llen(token_list_key(prefix, "u")) == 0
    assert ("t",) not in heard.calls
    assert await watched.consume_wake_hint("u") is True
    await watched.acknowledge_wakes(heard, 1)  # the claim it woke is done: t's turn
    await wait_until(lambda: ("t",) in heard.calls, timeout=5)


async def test_a_consumed_token_stays_in_the_processing_list_until_acknowledged(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer, worker, _ = adapters
    heard = Recorder()
    await worker.listen_job_scheduled(["t"], heard)
    await producer.notify_jobs_scheduled({"t": 1})
    await heard.wait_for(1, within=5)
    (consumer,) = await redis.zrange(consumers_key(prefix, "t"), 0, -1)
    processing = processing_key(prefix, "t", str(consumer))

    assert await worker.consume_wake_hint("t") is True
    assert await redis.llen(processing) == 1, "held until the claim is done"
    await worker.acknowledge_wakes(heard, 1)
    assert await redis.llen(processing) == 0


async def test_closing_a_consumer_gives_its_unacknowledged_tokens_back(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer, worker, _ = adapters
    heard = Recorder()
    await worker.listen_job_scheduled(["t"], heard)
    await producer.notify_jobs_scheduled({"t": 2})
    await heard.wait_for(2, within=5)
    assert await worker.consume_wake_hint("t") is True

    await worker.close()

    assert await redis.llen(token_list_key(prefix, "t")) == 2
    assert await redis.zcard(consumers_key(prefix, "t")) == 0


async def test_a_burst_beyond_the_cap_keeps_the_cap_and_consumers_wake_past_it(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer = adapters[0]
    await producer.notify_jobs_scheduled({"t": TOKEN_CAP + 5})
    assert await redis.llen(token_list_key(prefix, "t")) == TOKEN_CAP
    assert await redis.get(issued_key(prefix, "t")) == "overflow"

    await redis.delete(token_list_key(prefix, "t"))  # every token taken
    assert await producer.consume_wake_hint("t") is True, "jobs without a token exist"


async def test_tokens_expire_with_their_list_60_s_after_the_last_push(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    producer = adapters[0]
    await producer.notify_jobs_scheduled({"t": 1})
    await redis.expire(token_list_key(prefix, "t"), 5)
    await producer.notify_job_scheduled("t")
    assert await redis.ttl(token_list_key(prefix, "t")) > HINT_TTL_SECONDS - 5
    assert await redis.ttl(issued_key(prefix, "t")) > HINT_TTL_SECONDS - 5


async def test_lists_mode_publishes_nothing_on_the_scheduled_channel(
    adapters: list[RedisNotifyAdapter], redis_url: str, prefix: str
) -> None:
    subscriber = Redis.from_url(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe(channel_name(prefix, "sched"))
    try:
        await adapters[0].notify_jobs_scheduled({"t": 3})
        await adapters[0].notify_job_scheduled("t")
        messages = []
        while (message := await pubsub.get_message(timeout=0.3)) is not None:
            messages.append(message)
        assert [m for m in messages if m["type"] == "message"] == []
    finally:
        await pubsub.aclose()
        await subscriber.aclose()


async def test_a_busy_listener_of_one_type_holds_up_no_token_of_another_listeners_type(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    """Two workers on one adapter: free slots are wanted per type, so a token of the
    busy worker's type is not moved for the idle worker's slot (and the idle worker's
    token is), and it waits in its list for the busy worker's next free slot."""
    producer, shared, _ = adapters
    busy = await _reporting(shared, ["a"], 0)
    idle = await _reporting(shared, ["b"], 1)

    await producer.notify_jobs_scheduled({"a": 1})
    await producer.notify_jobs_scheduled({"b": 1})

    await idle.wait_for(1, within=5)
    assert idle.calls == [("b",)]
    assert busy.calls == []
    assert await redis.llen(token_list_key(prefix, "a")) == 1
    await shared.acknowledge_wakes(busy, 1)
    await busy.wait_for(1, within=5)
    assert busy.calls == [("a",)]


async def test_a_type_whose_listener_frees_a_slot_is_moved_while_the_lane_blocks_on_others(
    adapters: list[RedisNotifyAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane waits on the types wanted; a report that makes another type wanted ends
    that wait at once (not when the blocking move next times out, put off here)."""
    monkeypatch.setattr(lists_wire, "BLOCK_TIMEOUT", 8.0)  # below the socket's timeout
    producer, shared, _ = adapters
    busy = await _reporting(shared, ["a"], 0)
    idle = await _reporting(shared, ["b"], 2)
    await producer.notify_jobs_scheduled({"a": 1, "b": 1})
    await idle.wait_for(1, within=5)  # the lane blocks for idle's second slot, on b alone
    assert busy.calls == []

    await shared.acknowledge_wakes(busy, 1)

    await busy.wait_for(1, within=4)
    assert busy.calls == [("a",)]
    assert idle.calls == [("b",)]


async def test_a_token_no_free_slot_can_take_is_not_moved_though_its_type_has_one(
    adapters: list[RedisNotifyAdapter], redis: Redis, prefix: str
) -> None:
    """A worker of types a and b with one slot free heard of a token of a: a token of b
    would need the same slot, so it waits in its list; a token of another worker's type
    is moved all the same."""
    producer, shared, _ = adapters
    both = await _reporting(shared, ["a", "b"], 1)
    other = await _reporting(shared, ["c"], 1)
    await producer.notify_jobs_scheduled({"a": 1})
    await both.wait_for(1, within=5)

    await producer.notify_jobs_scheduled({"b": 1, "c": 1})

    await other.wait_for(1, within=5)
    assert other.calls == [("c",)]
    assert both.calls == [("a",)]
    assert await redis.llen(token_list_key(prefix, "b")) == 1


async def _reporting(adapter: RedisNotifyAdapter, types: list[str], free_slots: int) -> Recorder:
    """A listener of ``types`` on ``adapter`` that reported ``free_slots``."""
    heard = Recorder()
    await adapter.listen_job_scheduled(types, heard)
    await adapter.acknowledge_wakes(heard, free_slots)
    return heard
