"""Killed Postgres backends (``pg_terminate_backend``) mid-run: workers and the client
retry and carry on; no job is lost and none completes twice. On each async driver
(psycopg 3, asyncpg): a kill lands in a claim, a completion, a renewal or a start, each
sent on the driver connection under SQLAlchemy's (``state_adapters/drivers/``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.worker.worker import Worker, WorkerMode
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.e2e_app import effects_table
from tests.support.queue_helpers import drop_tables
from tests.test_postgres_notify import libpq_dsn

LEASE = 10.0
"""Seconds; renewed every third of it, so a renewal has over 6 s of retries. Each kill
costs a renewal a retry or two, and on a loaded machine each new connection takes
a while (6 s ran out once with two test runs side by side); that must not cost the
lease."""


KILL_INTERVAL = 0.6
"""Seconds between two rounds of kills (each kills every connection of the test). A
fresh asyncpg connection needs a few round trips (its type introspection) before it
is of use: on a loaded machine, kills every 0.3 s left the completions of a batch no
connection that lived long enough for 10 s, and their jobs ran again."""

CLIENT_PATIENCE = 60.0
"""Seconds the test's client retries one call through the kills before it gives up."""


class BackendKiller:
    """Terminates, every ``interval`` seconds, the backends of one application_name
    (this test's own sessions, never anyone else's) and counts them."""

    def __init__(self, postgres_url: str, application_name: str, interval: float) -> None:
        self.postgres_url = postgres_url
        self.application_name = application_name
        self.interval = interval
        self.killed = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BackendKiller:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            libpq_dsn(self.postgres_url), autocommit=True, application_name="queuert-killer"
        ) as admin:
            while True:
                await asyncio.sleep(self.interval)
                cursor = await admin.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                    "FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (self.application_name,),
                )
                row = await cursor.fetchone()
                self.killed += int(row[0]) if row else 0


@pytest.fixture
async def engine(async_postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    """An engine whose sessions carry this test's application_name, so the killer
    terminates only them."""
    connect_args: dict[str, Any] = (
        {"server_settings": {"application_name": prefix}}
        if async_postgres_url.startswith("postgresql+asyncpg")
        else {"application_name": prefix}
    )
    engine = create_async_engine(async_postgres_url, connect_args=connect_args, pool_size=12)
    try:
        yield engine
    finally:
        await engine.dispose()  # pooled connections may have been killed: start afresh
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


def _worker(client: Client, worker_id: str, mode: WorkerMode, handler: Any, events: Any) -> Worker:
    return Worker(
        client,
        {"effect": handler},
        worker_id=worker_id,
        mode=mode,
        concurrency=4,
        lease=LEASE,
        poll_interval=0.5,
        on_event=events.append,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["atomic", "staged"])
async def test_killed_backends_mid_run_lose_no_job_and_complete_none_twice(
    engine: AsyncEngine, postgres_url: str, prefix: str, mode: WorkerMode
) -> None:
    table_prefix = f"{prefix}_"
    # Short retry backoff: in atomic mode a connection lost at COMMIT fails the attempt.
    state = SqlAlchemyStateAdapter(
        engine, table_prefix=table_prefix, backoff_base=0.1, backoff_cap=1.0
    )
    await state.migrate()
    effects = effects_table(table_prefix)
    async with engine.begin() as conn:
        await conn.run_sync(effects.create)
    events: list[WorkerEvent] = []

    async def effect(job: Job, ctx: JobContext) -> dict[str, Any]:
        # Every 50th job outlives its lease: it is kept by renewals through the kills.
        await asyncio.sleep(LEASE + 1.0 if job.input["n"] % 50 == 0 else 0.005)
        if mode == "atomic":
            # Commits with the completion, or not at all.
            await ctx.session.execute(
                insert(effects).values(job_id=job.id, worker_id=ctx.worker_id)
            )
        return {"n": job.input["n"]}

    total, chunk = 400, 20
    async with (
        # The client rides through the kills too, retrying each call: on a loaded machine
        # a connection may take longer than the time between two kills for a while, so
        # it gets more than the default 5 s before it gives up (no promise is about that).
        Client(
            state=state, notify=InProcessNotifyAdapter(), database_timeout=CLIENT_PATIENCE
        ) as client,
        _worker(client, "a", mode, effect, events),
        _worker(client, "b", mode, effect, events),
        BackendKiller(postgres_url, prefix, interval=KILL_INTERVAL) as killer,
    ):
        # The client's own writes and reads ride through the kills too.
        chains = []
        for start in range(0, total, chunk):
            chains += await client.start_chains(
                [ChainSpec("effect", {"n": n}) for n in range(start, start + chunk)]
            )
            await asyncio.sleep(0.05)
        # Up to 90 s (below the test's 120 s timeout): on a loaded machine a long job
        # whose claim reply was lost waits for its lease (10 s) and runs again (11 s), and
        # in atomic mode each attempt whose connection was killed runs again too.
        done = [
            await client.await_chain(chain.id, timeout=90, poll_interval=0.5) for chain in chains
        ]
        kills = killer.killed

    assert kills >= 10, "the test must kill backends while jobs flow"
    assert [chain.output for chain in done] == [{"n": n} for n in range(total)]
    assert {status: n for status, n in (await client.count_jobs()).items() if n} == {
        "completed": total
    }
    # A claim whose backend was killed after its commit never reached its worker: that
    # job is reaped once its lease expires, then runs. A job that had started must keep
    # its lease through the kills.
    started: set[str] = set()
    lost = []
    for event in events:
        if event.kind == "started":
            started.add(event.job_id)
        elif event.kind == "ownership_lost" or (event.kind == "reaped" and event.job_id in started):
            lost.append(event)
    assert lost == [], "a lease was lost: renewal did not ride through the kills"
    completions = Counter(e.job_id for e in events if e.kind == "completed")
    assert len(completions) == total
    assert set(completions.values()) == {1}, "a job completed twice"
    if mode == "atomic":
        async with engine.connect() as conn:
            rows, distinct = (
                await conn.execute(
                    select(func.count(), func.count(func.distinct(effects.c.job_id)))
                )
            ).one()
        assert (rows, distinct) == (total, total)


async def _terminate(postgres_url: str, application_name: str) -> int:
    """Terminate every backend of ``application_name``; how many."""
    async with await psycopg.AsyncConnection.connect(
        libpq_dsn(postgres_url), autocommit=True
    ) as admin:
        cursor = await admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
            "FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def test_starts_on_connections_whose_backends_were_killed_while_idle_are_made_once(
    engine: AsyncEngine, postgres_url: str, prefix: str
) -> None:
    """Every pooled connection's backend terminated while it sat idle: the next start
    through the client is retried on a new connection and makes its chain once; a
    start in the caller's session on such a connection raises a lost connection the
    caller retries, and the pool never hands that connection out again."""
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        await client.start_chain("effect", {"n": 0})  # the client's connections are open
        assert await _terminate(postgres_url, prefix) >= 1

        await client.start_chain("effect", {"n": 1})

        async with AsyncSession(engine) as session:
            await session.execute(select(1))  # a pooled connection: maybe a killed one
            await session.commit()
        killed = await _terminate(postgres_url, prefix)
        # Each killed connection fails at most one attempt: it is invalidated, not
        # handed out again.
        for _ in range(killed + 1):
            try:
                async with AsyncSession(engine) as session, session.begin():
                    await client.start_chain("effect", {"n": 2}, session=session)
                break
            except DBAPIError as lost:
                assert lost.connection_invalidated, lost
        else:
            pytest.fail(f"{killed + 1} attempts failed for {killed} killed connections")

        counts = await client.count_jobs()
        assert {status: n for status, n in counts.items() if n} == {"pending": 3}
