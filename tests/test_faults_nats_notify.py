"""Faults the NATS adapter survives: a server killed and started again on the same port."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from queuert_notify import ConfigurationError, NatsNotifyAdapter
from queuert_notify.testing import Recorder
from tests.support.queue_helpers import other_tasks
from tests.support.services import OwnServer, free_port


async def test_after_a_server_restart_subscriptions_resume_and_on_reconnect_fires(
    private_nats: OwnServer, prefix: str
) -> None:
    async with (
        NatsNotifyAdapter(private_nats.url, prefix=prefix) as adapter,
        NatsNotifyAdapter(private_nats.url, prefix=prefix) as publisher,
    ):
        reconnects, publisher_back = Recorder(), Recorder()
        adapter.on_reconnect(reconnects)
        publisher.on_reconnect(publisher_back)
        scheduled, completed, lost = Recorder(), Recorder(), Recorder()
        await adapter.listen_job_scheduled(["t"], scheduled)
        await adapter.listen_chain_completed("c", completed)
        await adapter.listen_job_ownership_lost("j", lost)
        await publisher.provide_wake_hint("before", 1)

        await asyncio.to_thread(private_nats.kill)
        await asyncio.sleep(0.5)  # down for a while: no signal until it is back
        assert reconnects.calls == []
        await asyncio.to_thread(private_nats.start)
        # Both clients are back: the publisher reconnects on its own schedule (publishing
        # while it still reconnects fails at once, seen on a loaded machine).
        await reconnects.wait_for(1, within=15.0)
        await publisher_back.wait_for(1, within=15.0)
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

    async with asyncio.timeout(15.0):
        while True:  # until the client has noticed; nothing to wait on but a failing call
            try:
                await adapter.notify_chain_completed("c")
            except nats.errors.ConnectionReconnectingError:
                break
            except nats.errors.TimeoutError:
                pass  # sent before the client noticed: its flush waited out the timeout
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
    # One call queued until the 5 s timeout would exceed this; a stalled machine does not.
    assert loop.time() - started < 4.0
    await asyncio.sleep(2.5)  # a couple of failed reconnect attempts
    closing = loop.time()
    await adapter.close()
    assert loop.time() - closing < 4.0  # not the 5 s close_timeout
    assert other_tasks() == before


async def test_while_no_server_was_ever_reached_every_call_fails_at_once_naming_the_address(
    prefix: str,
) -> None:
    before = other_tasks()
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: refused at once
    adapter = NatsNotifyAdapter(url, prefix=prefix, timeout=5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for call in (
        adapter.connect,
        lambda: adapter.notify_chain_completed("c"),
        lambda: adapter.notify_jobs_scheduled({"t": 1}),
        lambda: adapter.provide_wake_hint("t", 1),
        lambda: adapter.consume_wake_hint("t"),
        lambda: adapter.listen_job_scheduled(["t"], Recorder()),
    ):
        with pytest.raises(ConfigurationError, match=f"cannot reach NATS at {url}: ") as caught:
            await call()
        assert "no answer in time" not in str(caught.value), "the refusal is the reason"
    # Six calls, each of which used to wait out the whole 5 s timeout (room left for a
    # stalled machine).
    assert loop.time() - started < 4.0
    await adapter.close()
    assert other_tasks() == before


async def test_with_one_of_two_servers_down_connect_reaches_the_other(
    private_nats: OwnServer, prefix: str
) -> None:
    down = f"nats://127.0.0.1:{free_port()}"
    async with NatsNotifyAdapter(f"{down},{private_nats.url}", prefix=prefix) as adapter:
        heard = Recorder()
        await adapter.listen_chain_completed("c", heard)
        await adapter.notify_chain_completed("c")
        await heard.wait_for(1, within=5.0)
