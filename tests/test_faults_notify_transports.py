"""A worker through a broken notify transport: a NATS server restarted, the Postgres
LISTEN backend terminated. Once the transport is back, an idle worker with a 60 s poll
runs what was announced meanwhile at once and wakes within 200 ms again. (Redis:
tests/test_faults_redis_restart.py; the adapters alone: test_*_notify_faults.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from queuert_notify import Client, NatsNotifyAdapter, PostgresNotifyAdapter, Worker
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing import Recorder
from tests.support.queue_helpers import ClaimPasses, all_but_the_slowest, wait_until
from tests.support.services import OwnServer
from tests.test_postgres_notify import libpq_dsn, listener_backends

pytest_plugins = ["tests.support.queue_fixtures"]


@dataclass
class BrokenTransport:
    """How to make adapters on a transport this test may break, and how to break it."""

    make: Callable[[], NotifyAdapter]
    break_: Callable[[], Awaitable[None]]
    restore: Callable[[], Awaitable[None]]
    outage: bool
    """True when the transport stays down until ``restore`` (not a momentary break)."""


def _nats(request: pytest.FixtureRequest, prefix: str) -> BrokenTransport:
    server: OwnServer = request.getfixturevalue("private_nats")

    async def kill() -> None:
        await asyncio.to_thread(server.kill)

    async def start() -> None:
        await asyncio.to_thread(server.start)

    return BrokenTransport(lambda: NatsNotifyAdapter(server.url, prefix=prefix), kill, start, True)


def _postgres(request: pytest.FixtureRequest, prefix: str) -> BrokenTransport:
    url: str = request.getfixturevalue("postgres_url")

    async def terminate_listener() -> None:
        # Only the LISTEN sessions of this test's prefix, never anyone else's.
        [pid] = await listener_backends(url, prefix)
        async with await psycopg.AsyncConnection.connect(libpq_dsn(url), autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    async def nothing() -> None:
        return None

    return BrokenTransport(
        lambda: PostgresNotifyAdapter(url, prefix=prefix), terminate_listener, nothing, False
    )


@pytest.mark.timing
@pytest.mark.alone  # a bound in tenths of a second: not beside the suite
@pytest.mark.parametrize("transport_kind", ["nats", "postgres"])
async def test_after_the_transport_breaks_an_idle_worker_polls_at_once_and_wakes_fast_again(
    transport_kind: str, request: pytest.FixtureRequest, state: Any, prefix: str
) -> None:
    transport = {"nats": _nats, "postgres": _postgres}[transport_kind](request, prefix)
    started: dict[str, float] = {}

    async def ping(job: Job, ctx: JobContext) -> None:
        started[job.chain_id] = time.perf_counter()

    worker_notify = transport.make()
    passes = ClaimPasses(state)
    worker_client = Client(state=passes, notify=worker_notify)
    client = Client(state=state, notify=transport.make())
    # lease=120: the reaper, too, wakes the worker only every 60 s.
    worker = Worker(worker_client, {"ping": ping}, poll_interval=60, lease=120)

    async def client_sends() -> bool:
        try:
            await client.notify.notify_chain_completed("probe")
        except Exception:
            return False
        return True

    async with client, worker_client, worker:
        restored = Recorder()
        worker_notify.on_reconnect(restored)
        # Let the worker finish its start-up claims and fall asleep on its 60 s poll,
        # so only the reconnect can run what is started during the outage.
        warm_up = await client.start_chain("ping")
        await client.await_chain(warm_up.id, timeout=5)
        await wait_until(passes.idle)
        await transport.break_()
        during = await client.start_chain("ping")  # its wakeup is lost or refused
        if transport.outage:
            await asyncio.sleep(0.5)
            assert during.id not in started, "nothing should have woken the 60 s poller"
        await transport.restore()
        await restored.wait_for(1, within=15.0)
        # Polled at once: long before the 60 s poll (room for a stalled machine).
        await wait_until(lambda: during.id in started, timeout=20, interval=0.05)

        await wait_until(client_sends, timeout=15, interval=0.1)
        latencies = []
        for _ in range(5):
            before = time.perf_counter()
            chain = await client.start_chain("ping")
            await client.await_chain(chain.id, timeout=5, poll_interval=0.1)
            latencies.append(started[chain.id] - before)
    assert all_but_the_slowest(latencies) < 0.2, latencies
