"""Redis unreachable when a worker starts: by default the worker runs on polling alone,
says so in a warning, and listens for wakeups once Redis answers; with
``Client(require_notify=True)`` it refuses to start, naming the address."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queuert_notify import ChainSpec, Client, ConfigurationError, RedisNotifyAdapter, Worker
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.redis.shared import channel_name
from tests.support.queue_helpers import all_but_the_slowest, other_tasks, wait_until
from tests.support.redis_helpers import wait_for_subscribers
from tests.support.services import OwnServer, own_redis_server

pytest_plugins = ["tests.support.queue_fixtures"]

PASSWORD = "s3cret-pw"


@pytest.fixture
def down_redis(tmp_path: Path) -> Iterator[OwnServer]:
    """A password-protected redis-server of this test's own, stopped: the test starts it."""
    for server in own_redis_server(tmp_path, "--requirepass", PASSWORD):
        server.kill()
        yield server


def _url(server: OwnServer) -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


@pytest.mark.timing
async def test_worker_starts_on_polling_alone_then_listens_once_redis_answers(
    down_redis: OwnServer, state: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    started: dict[str, float] = {}

    async def ping(job: Job, ctx: JobContext) -> None:
        started[job.chain_id] = time.perf_counter()

    url = _url(down_redis)
    enqueuer = Client(state=state, notify=RedisNotifyAdapter(url, prefix=prefix))
    worker_client = Client(state=state, notify=RedisNotifyAdapter(url, prefix=prefix))
    caplog.set_level(logging.WARNING)
    # jitter=0: without a wakeup, a job waits for the next 2 s tick of the poll timer.
    worker = Worker(worker_client, {"ping": ping}, poll_interval=2.0, jitter=0)
    async with enqueuer, worker_client, worker:
        [warning] = [r for r in caplog.records if "cannot listen for wakeups" in r.getMessage()]
        assert f"127.0.0.1:{down_redis.port}" in warning.getMessage()

        # Redis is down: the job is found by the poll timer.
        chain = await enqueuer.start_chain("ping")
        done = await enqueuer.await_chain(chain.id, timeout=10, poll_interval=0.1)
        assert done.status == "completed"

        await asyncio.to_thread(down_redis.start)
        await wait_for_subscribers(url, channel_name(prefix, "sched"), 1, within=15.0)
        latencies = []
        for _ in range(5):
            before = time.perf_counter()
            chain = await enqueuer.start_chain("ping")
            await enqueuer.await_chain(chain.id, timeout=10, poll_interval=0.1)
            latencies.append(started[chain.id] - before)
    # Woken, not polled: a job found by the 2 s poll timer waits a second on average.
    assert all_but_the_slowest(latencies) < 0.2, latencies
    assert PASSWORD not in caplog.text


async def test_with_require_notify_a_worker_refuses_to_start_and_names_the_address(
    down_redis: OwnServer, state: Any, prefix: str
) -> None:
    before = other_tasks()
    notify = RedisNotifyAdapter(_url(down_redis), prefix=prefix)
    client = Client(state=state, notify=notify, require_notify=True)
    worker = Worker(client, {"ping": lambda job, ctx: None})

    with pytest.raises(ConfigurationError) as raised:
        await worker.run(handle_signals=False)
    message = str(raised.value)
    assert f"redis://:***@127.0.0.1:{down_redis.port}/0" in message
    assert PASSWORD not in message
    with pytest.raises(ConfigurationError):
        async with client:
            pass
    await notify.close()
    assert other_tasks() == before


@pytest.mark.timing
async def test_a_backlog_drains_at_full_speed_while_redis_is_down(
    down_redis: OwnServer, state: Any, prefix: str
) -> None:
    """Asking an unreachable Redis for wake hints costs redis-py's retries (~0.4 s) per
    call; a worker that cannot reach it asks about once a second and claims meanwhile."""
    url = _url(down_redis)
    async with Client(state=state, notify=RedisNotifyAdapter(url, prefix=prefix)) as client:
        chains = [c.id for c in await client.start_chains([ChainSpec("ping")] * 40)]
        began = time.perf_counter()
        async with Worker(client, {"ping": lambda job, ctx: None}, concurrency=1):
            await wait_until(lambda: _all_completed(client, len(chains)), timeout=30)
        took = time.perf_counter() - began
    # A worker asking Redis before each claim would take 40 x 0.4 s = 16 s.
    assert took < 10.0, f"40 jobs took {took:.1f}s"


async def _all_completed(client: Client, n: int) -> bool:
    return (await client.count_jobs()).get("completed", 0) == n
