"""``SyncClient``: synchronous applications enqueue in their own ``Session``'s
transaction; worker processes pick the jobs up. Real Postgres and SQLite, real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from queuert_notify import (
    ChainNotFoundError,
    ChainSpec,
    Client,
    ConfigurationError,
    InProcessNotifyAdapter,
    PostgresNotifyAdapter,
    RedisNotifyAdapter,
    SyncClient,
)
from queuert_notify.notify.redis.shared import channel_name
from tests.support.queue_helpers import STATE_KINDS, all_but_the_slowest, wait_until
from tests.support.redis_helpers import wait_for_subscribers
from tests.support.worker_processes import WorkerProcesses
from tests.test_postgres_notify import listener_backends

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]

BOTH = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)


@pytest.fixture
def sched_messages(redis_url: str, prefix: str) -> Iterator[Any]:
    """A subscriber to the Redis ``sched`` channel of this test's prefix."""
    connection = redis.Redis.from_url(redis_url)
    pubsub = connection.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(f"{prefix}:sched")
    try:
        yield pubsub
    finally:
        pubsub.close()
        for key in connection.scan_iter(f"{prefix}:*"):
            connection.delete(key)
        connection.close()


def _received(pubsub: Any, within: float = 1.0) -> list[str]:
    deadline, messages = time.monotonic() + within, []
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message is not None:
            messages.append(message["data"].decode())
    return messages


@BOTH
def test_a_rolled_back_session_leaves_no_job_and_no_wakeup(
    sync_engine: Engine, redis_url: str, prefix: str, sched_messages: Any, table_prefix: str
) -> None:
    notify = RedisNotifyAdapter(redis_url, prefix=prefix)
    with SyncClient(sync_engine, notify=notify, table_prefix=table_prefix) as client:
        with Session(sync_engine) as session, session.begin():
            kept = client.start_chain("send-email", {"to": "a@b.c"}, session=session)
        with Session(sync_engine) as session:
            session.begin()
            dropped = client.start_chain("send-email", {"to": "x@y.z"}, session=session)
            session.rollback()
        with Session(sync_engine) as session, session.begin():
            nested = session.begin_nested()
            in_savepoint = client.start_chain("audit", session=session, dedup_key="k")
            nested.rollback()
            client.start_chain("report", session=session)
        assert client.get_chain(kept.id).status == "pending"
        assert _received(sched_messages) == ["send-email", "report"]
    for gone in (dropped.id, in_savepoint.id):
        with pytest.raises(ChainNotFoundError):
            SyncClient(sync_engine, table_prefix=table_prefix).get_chain(gone)


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
def test_a_sync_client_of_a_lists_adapter_pushes_wake_tokens_after_commit(
    sync_engine: Engine, redis_url: str, prefix: str, sched_messages: Any, table_prefix: str
) -> None:
    notify = RedisNotifyAdapter(redis_url, prefix=prefix, wake="lists")
    tokens = redis.Redis.from_url(redis_url)
    try:
        with SyncClient(sync_engine, notify=notify, table_prefix=table_prefix) as client:
            with Session(sync_engine) as session, session.begin():
                client.start_chains([ChainSpec("send-email")] * 3, session=session)
            with Session(sync_engine) as session:
                session.begin()
                client.start_chain("send-email", session=session)
                session.rollback()
            deadline = time.monotonic() + 5
            while tokens.llen(f"{prefix}:wake:send-email") < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert tokens.llen(f"{prefix}:wake:send-email") == 3, "one token per committed job"
        assert _received(sched_messages, within=0.2) == [], "nothing is published"
    finally:
        tokens.close()


@pytest.mark.parametrize("state_kind", ["sqlite"], indirect=True)
def test_wakeups_follow_commits_again_after_redis_restarts(
    sync_engine: Engine, private_redis: Any, prefix: str, table_prefix: str
) -> None:
    # A restarted server has closed the sender's connection and forgotten the scripts.
    url = private_redis.url
    notify = RedisNotifyAdapter(url, prefix=prefix)
    with SyncClient(sync_engine, notify=notify, table_prefix=table_prefix) as client:
        for _ in range(2):
            listener = redis.Redis.from_url(url)
            pubsub = listener.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(f"{prefix}:sched")
            try:
                client.start_chain("send-email")
                assert _received(pubsub) == ["send-email"]
                assert listener.get(f"{prefix}:hint:send-email") == b"1", "the wake budget"
            finally:
                pubsub.close()
                listener.close()
            private_redis.restart()


@BOTH
def test_eight_threads_start_four_thousand_chains_and_none_is_lost(
    sync_engine: Engine, table_prefix: str
) -> None:
    client = SyncClient(sync_engine, table_prefix=table_prefix)
    started: list[str] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        for i in range(500):
            with Session(sync_engine) as session, session.begin():
                chain = client.start_chain("job", {"thread": n, "i": i}, session=session)
            with lock:
                started.append(chain.id)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    assert len(set(started)) == 4000
    with sync_engine.connect() as conn:
        stored = conn.scalar(text(f"SELECT count(*) FROM {table_prefix}jobs"))
    assert stored == 4000


@pytest.mark.timing
@pytest.mark.parametrize(
    ("state_kind", "notify_kind"),
    [("postgres", "redis"), ("asyncpg", "redis"), ("sqlite", "redis"), ("postgres", "noop")],
    indirect=True,
)
async def test_a_worker_process_runs_a_sync_started_job_within_the_wake_latency(
    sync_engine: Engine,
    workers: WorkerProcesses,
    effects: Any,
    notify_kind: str,
    state_kind: str,
    redis_url: str,
    prefix: str,
    table_prefix: str,
) -> None:
    # The workers poll once a minute: only a wakeup brings the job in time.
    if notify_kind == "noop":  # Postgres NOTIFY inside the start's transaction
        workers.env["QT_POSTGRES_NOTIFY"] = prefix
        notify: Any = PostgresNotifyAdapter(str(sync_engine.url), prefix=prefix)
    else:
        notify = RedisNotifyAdapter(redis_url, prefix=prefix)
    workers.start("w1", QT_POLL="60")
    client = SyncClient(sync_engine, notify=notify, table_prefix=table_prefix)
    # Measured from the moment the worker listens (its start-up takes seconds under load).
    if notify_kind == "noop":
        await wait_until(lambda: listener_backends(str(sync_engine.url), prefix), timeout=30)
    else:
        await wait_for_subscribers(redis_url, channel_name(prefix, "sched"), 1, within=30)
    latencies = []
    for _ in range(5):
        began = time.monotonic()
        with Session(sync_engine) as session, session.begin():
            chain = client.start_chain("effect", session=session)
        done = client.await_chain(chain.id, timeout=10, poll_interval=0.01)
        latencies.append(time.monotonic() - began)
        assert done.status == "completed", workers.log("w1")
    client.close()
    assert all_but_the_slowest(latencies) < 1.0, latencies


@BOTH
def test_cancel_retry_and_await_from_sync_code(sync_engine: Engine, table_prefix: str) -> None:
    with SyncClient(sync_engine, table_prefix=table_prefix) as client:
        chain = client.start_chain("job", delay=3600)
        assert client.cancel_chain(chain.id).status == "cancelled"
        assert client.await_chain(chain.id, timeout=1).status == "cancelled"
        assert client.retry_chain(chain.id).status == "pending"


def test_the_wrong_client_for_a_session_or_engine_is_a_type_error_that_names_the_right_one(
    sync_engine: Engine, engine: AsyncEngine, client: Client, table_prefix: str
) -> None:
    with pytest.raises(TypeError, match=r"AsyncEngine .* belongs to queuert_notify\.Client"):
        SyncClient(engine)  # type: ignore[arg-type]
    sync_client = SyncClient(sync_engine, table_prefix=table_prefix)
    from sqlalchemy.ext.asyncio import AsyncSession

    with pytest.raises(TypeError, match=r"belongs to queuert_notify\.Client"):
        sync_client.start_chain("job", session=AsyncSession(engine))  # type: ignore[arg-type]


async def test_the_async_client_refuses_a_sync_session_naming_sync_client(
    sync_engine: Engine, client: Client
) -> None:
    with Session(sync_engine) as session, pytest.raises(TypeError, match="SyncClient"):
        await client.start_chain("job", session=session)  # type: ignore[arg-type]


def test_adapters_without_a_blocking_client_are_refused(
    sync_engine: Engine, table_prefix: str
) -> None:
    with pytest.raises(ConfigurationError, match="cannot publish through InProcessNotifyAdapter"):
        SyncClient(sync_engine, notify=InProcessNotifyAdapter(), table_prefix=table_prefix)
