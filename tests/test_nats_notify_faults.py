"""Faults the NATS adapter survives: a server killed and started again on the same port."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from queuert_notify import NatsNotifyAdapter
from queuert_notify.testing import Recorder
from tests.queue_helpers import other_tasks
from tests.services import OwnServer


async def test_after_a_server_restart_subscriptions_resume_and_on_reconnect_fires(
    private_nats: OwnServer, prefix: str
) -> None:
    async with (
        NatsNotifyAdapter(private_nats.url, prefix=prefix) as adapter,
        NatsNotifyAdapter(private_nats.url, prefix=prefix) as publisher,
    ):
        reconnects = Recorder()
        adapter.on_reconnect(reconnects)
        scheduled, completed, lost = Recorder(), Recorder(), Recorder()
        await adapter.listen_job_scheduled(["t"], scheduled)
        await adapter.listen_chain_completed("c", completed)
        await adapter.listen_job_ownership_lost("j", lost)
        await publisher.provide_wake_hint("before", 1)

        await asyncio.to_thread(private_nats.kill)
        await asyncio.sleep(0.5)  # down for a while: no signal until it is back
        assert reconnects.calls == []
        await asyncio.to_thread(private_nats.start)
        await reconnects.wait_for(1, within=15.0)

        # Both clients are back (the publisher may reconnect a moment later).
        await publisher.notify_chain_completed("c")
        await completed.wait_for(1, within=15.0)
        await publisher.notify_jobs_scheduled({"t": 1})
        await publisher.notify_job_ownership_lost("j")
        await scheduled.wait_for(1, within=5.0)
        await lost.wait_for(1, within=5.0)

        # The in-memory budgets died with the server: consume wakes, the bucket returns.
        assert await adapter.consume_wake_hint("before") is True
        assert await adapter.consume_wake_hint("t") is True
        assert await adapter.consume_wake_hint("t") is False
        assert len(reconnects.calls) == 1


async def test_while_the_server_is_down_calls_fail_fast_and_close_leaves_no_task(
    private_nats: OwnServer, prefix: str
) -> None:
    before = other_tasks()
    adapter = NatsNotifyAdapter(private_nats.url, prefix=prefix)
    await adapter.connect()
    await adapter.listen_job_scheduled(["t"], Recorder())
    await asyncio.to_thread(private_nats.kill)

    async with asyncio.timeout(5.0):
        while True:  # until the client has noticed; nothing to wait on but a failing call
            try:
                await adapter.notify_chain_completed("c")
            except nats.errors.ConnectionReconnectingError:
                break
            await asyncio.sleep(0.05)
    # Said at once instead of queued: callers log and poll.
    loop = asyncio.get_running_loop()
    started = loop.time()
    for call in (
        lambda: adapter.notify_jobs_scheduled({"t": 1}),
        lambda: adapter.consume_wake_hint("t"),
        lambda: adapter.listen_chain_completed("c", Recorder()),
    ):
        with pytest.raises(nats.errors.ConnectionReconnectingError):
            await call()
    # A subject already subscribed takes more listeners (the client re-subscribes it).
    await adapter.listen_job_scheduled(["u"], Recorder())
    await asyncio.sleep(2.5)  # a couple of failed reconnect attempts
    await adapter.close()

    assert loop.time() - started < 5.0
    assert other_tasks() == before
