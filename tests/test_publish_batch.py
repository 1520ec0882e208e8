"""Notifications a committed change owes are sent in one transport call, not one per
chain: the completions of a batch of jobs cost one Redis round trip."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from queuert_notify import RedisNotifyAdapter
from queuert_notify.notify.publish_batch import Message, PublishBatch
from state_adapters.notifications import NotificationBuffer
from tests.support.services import OwnServer


async def test_messages_published_in_one_turn_go_out_in_one_call_in_order() -> None:
    calls: list[list[Message]] = []

    async def send(messages: list[Message]) -> None:
        calls.append(messages)

    batch = PublishBatch(send)
    await asyncio.gather(*(batch.publish(("chan", str(n))) for n in range(10)))
    await batch.publish(("chan", "later"))

    assert calls == [[("chan", str(n)) for n in range(10)], [("chan", "later")]]


async def test_every_caller_of_a_failed_call_gets_its_error() -> None:
    async def send(messages: list[Message]) -> None:
        raise ConnectionError("server away")

    batch = PublishBatch(send)
    results = await asyncio.gather(
        *(batch.publish(("chan", str(n))) for n in range(3)), return_exceptions=True
    )

    assert [type(result) for result in results] == [ConnectionError] * 3


async def test_a_cancelled_leader_leaves_its_joiners_an_error_not_its_cancellation() -> None:
    started = asyncio.Event()

    async def send(messages: list[Message]) -> None:
        started.set()
        await asyncio.sleep(60)

    batch = PublishBatch(send)
    leader = asyncio.create_task(batch.publish(("chan", "a")))
    joiner = asyncio.create_task(batch.publish(("chan", "b")))
    await started.wait()
    leader.cancel()

    with pytest.raises(ConnectionError):
        await joiner
    with pytest.raises(asyncio.CancelledError):
        await leader


async def test_a_flush_of_a_hundred_completions_is_one_round_trip_not_a_hundred(
    private_redis: OwnServer, prefix: str
) -> None:
    # Counted by the server (read events it processed), on a server of this test's own.
    received: list[str] = []
    all_received = asyncio.Event()
    listener = RedisNotifyAdapter(url=private_redis.url, prefix=prefix)
    publisher = RedisNotifyAdapter(url=private_redis.url, prefix=prefix)
    admin = Redis.from_url(private_redis.url)
    chain_ids = [f"chain-{n}" for n in range(100)]

    def receive(chain_id: str) -> None:
        received.append(chain_id)
        if len(received) == 2 * len(chain_ids):
            all_received.set()

    async def reads() -> int:
        return int((await admin.info("stats"))["total_reads_processed"])

    try:
        async with listener, publisher:
            for chain_id in chain_ids:
                await listener.listen_chain_completed(chain_id, lambda c=chain_id: receive(c))
            before = await reads()
            for chain_id in chain_ids:  # one after another: a round trip each
                await publisher.notify_chain_completed(chain_id)
            one_by_one = await reads() - before - 1  # less the INFO call itself

            notes = NotificationBuffer()
            for chain_id in chain_ids:
                notes.chain_completed(chain_id)
            before = await reads()
            await notes.flush(publisher)
            flush = await reads() - before - 1

            async with asyncio.timeout(10):
                await all_received.wait()
    finally:
        await admin.aclose()

    assert sorted(received) == sorted(chain_ids * 2)
    assert one_by_one >= len(chain_ids), one_by_one
    # One pipelined send; the server may read a large one in a few pieces.
    assert flush <= 3, flush
