"""Behind PgBouncer in transaction pooling mode (a real one, started per test module):
the queue runs through it on psycopg 3 and asyncpg engines made with the pooler settings
(docs/databases.md, "Behind PgBouncer"); an engine without them is refused in one line
naming the setting, never a raw "prepared statement does not exist" from a worker loop;
Redis keeps waking workers at once; many worker processes share a few server
connections."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from queuert_notify import (
    ChainNotFoundError,
    ChainSpec,
    Client,
    ConfigurationError,
    InProcessNotifyAdapter,
    PostgresNotifyAdapter,
    RedisNotifyAdapter,
    Schedule,
    SyncClient,
    Worker,
)
from queuert_notify.cli import main
from queuert_notify.dashboard import create_app
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter
from tests.support.pgbouncer import POOLER_SETTINGS, Bouncer, own_pgbouncer, worker_fleet
from tests.support.queue_helpers import ClaimPasses, drop_tables, wait_until
from tests.support.redis_helpers import delete_prefix

# The module's PgBouncer (module scope) is started once: one xdist worker runs them all.
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group(__name__)]


@pytest.fixture(scope="module")
def bouncer(postgres_url: str) -> Iterator[Bouncer]:
    with own_pgbouncer(postgres_url, pool_size=10) as b:
        yield b


@pytest.fixture(params=sorted(POOLER_SETTINGS))
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def direct(postgres_url: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    """The test Postgres without PgBouncer: for checks and cleanup only."""
    engine = create_async_engine(postgres_url)
    try:
        yield engine
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


@pytest.fixture
async def pooled(bouncer: Bouncer, driver: str, direct: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """An engine through PgBouncer with the documented settings of its driver."""
    engine = create_async_engine(bouncer.url(driver), connect_args=POOLER_SETTINGS[driver])
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_the_queue_runs_through_pgbouncer(
    pooled: AsyncEngine, direct: AsyncEngine, bouncer: Bouncer, prefix: str
) -> None:
    state = SqlAlchemyStateAdapter(pooled, table_prefix=f"{prefix}_")
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        await client.set_limits("limited", concurrency=2)
        parent = await client.start_chain("first", {"n": 0})
        started = await client.start_chains([ChainSpec("first", {"n": n}) for n in range(1, 60)])
        limited = await client.start_chains([ChainSpec("limited", {"n": n}) for n in range(5)])
        blocked = await client.start_chain("first", {"n": -1}, blockers=[parent.id])
        again = await client.start_chain("first", {"n": 99}, dedup_key="once")
        assert (await client.start_chain("first", {}, dedup_key="once")).id == again.id
        async with AsyncSession(pooled) as session:  # the queue's statement first in it
            await session.begin()
            dropped = await client.start_chain("first", {"n": 100}, session=session)
            await session.rollback()
        async with AsyncSession(pooled) as session, session.begin():
            kept = await client.start_chain("first", {"n": 101}, session=session)
        with pytest.raises(ChainNotFoundError):
            await client.get_chain(dropped.id)

        async def first(job: Any, ctx: Any) -> Any:
            return ctx.continue_with("second", {"n": job.input["n"]})

        async def second(job: Any, ctx: Any) -> Any:
            await ctx.session.execute(text("SELECT 1"))  # atomic mode: the handler's session
            return {"n": job.input["n"]}

        running_limited: list[int] = [0, 0]  # now, most at once

        async def limited_job(job: Any, ctx: Any) -> Any:
            running_limited[0] += 1
            running_limited[1] = max(running_limited)
            await asyncio.sleep(0.05)
            running_limited[0] -= 1

        async def tick(job: Any, ctx: Any) -> Any:
            return None

        handlers = {"first": first, "second": second, "limited": limited_job}
        # Far past psycopg's 5 runs before it would prepare a statement.
        ran = await run_until_idle(client, handlers, timeout=120)
        chains = [parent, *started, blocked, again, kept, *limited]
        left = {t: await client.count_jobs(type_names=[t]) for t in handlers}
        assert ran == 2 * 63 + 5, left  # two jobs per chain, one per limited chain
        # The claim function of limited types, through PgBouncer: 2 at a time at most.
        assert 1 <= running_limited[1] <= 2
        for chain in chains:
            assert (await client.get_chain(chain.id)).status == "completed"
        assert await client.prune(older_than=timedelta(0)) == len(chains)

        # Schedules: one chain per tick, started through PgBouncer.
        worker = Worker(
            client,
            {"tick": tick},
            schedules=[Schedule("tick", "tick", every=timedelta(seconds=1))],
            poll_interval=0.2,
        )
        running = asyncio.create_task(worker.run())
        try:

            async def ticked() -> bool:
                return (await client.count_jobs(type_names=["tick"])).get("completed", 0) >= 2

            await wait_until(ticked, timeout=30)
        finally:
            await worker.stop()
            await running

        chain = await client.start_chain("shown", {"to": "a@b.c"})
        app = create_app(state, client.notify)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as h:
            for path in ["/", "/chains", f"/chains/{chain.id}"]:
                response = await h.get(path)
                assert response.status_code == 200, path
                assert "shown" in response.text
    assert bouncer.server_connections() <= 10


@pytest.mark.parametrize(
    ("sync_driver", "connect_args"),
    [("psycopg2", {}), ("psycopg", POOLER_SETTINGS["psycopg"])],
)
def test_a_sync_client_enqueues_through_pgbouncer(
    bouncer: Bouncer,
    direct: AsyncEngine,
    prefix: str,
    sync_driver: str,
    connect_args: dict[str, Any],
) -> None:
    engine = create_engine(bouncer.url(sync_driver), connect_args=connect_args)
    try:
        with SyncClient(engine, table_prefix=f"{prefix}_") as client:
            client.migrate()
            for n in range(20):  # past psycopg's 5 runs before it would prepare
                with Session(engine) as session, session.begin():
                    chain = client.start_chain("t", {"n": n}, session=session)
                assert client.get_chain(chain.id).status == "pending"
    finally:
        engine.dispose()


def test_a_sync_client_without_the_settings_is_refused_naming_them(
    bouncer: Bouncer, direct: AsyncEngine, prefix: str
) -> None:
    engine = create_engine(bouncer.url("psycopg"))
    try:
        with pytest.raises(ConfigurationError, match="prepare_threshold"):
            SyncClient(engine, table_prefix=f"{prefix}_").migrate()
    finally:
        engine.dispose()


def test_the_cli_runs_through_pgbouncer(
    bouncer: Bouncer, driver: str, direct: AsyncEngine, prefix: str
) -> None:
    # The CLI makes its own engine from the URL, with the pooler settings.
    common = ["--database-url", bouncer.url(driver), "--table-prefix", f"{prefix}_"]
    runner = CliRunner()
    for command in (
        ["migrate"],
        ["chains", "list"],
        ["limits", "t", "--concurrency", "2"],
        ["pause", "t"],
        ["resume", "t"],
        ["prune", "--older-than", "1d"],
    ):
        for _ in range(3):
            result = runner.invoke(main, [*command, *common])
            assert result.exit_code == 0, (command, result.output)


async def test_an_engine_that_keeps_prepared_statements_is_refused_naming_the_setting(
    bouncer: Bouncer, driver: str, direct: AsyncEngine, prefix: str
) -> None:
    await SqlAlchemyStateAdapter(direct, table_prefix=f"{prefix}_").migrate()
    engine = create_async_engine(bouncer.url(driver))
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
        with pytest.raises(ConfigurationError) as raised:
            await state.migrate()
        message = str(raised.value)
        assert "\n" not in message
        assert "PgBouncer" in message
        for setting in POOLER_SETTINGS[driver]:
            assert setting in message
        # A worker on it stops with that error, not with the driver's.
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            worker = Worker(client, {"t": lambda job, ctx: None}, poll_interval=0.1)
            with pytest.raises(ConfigurationError, match="prepare"):
                await asyncio.wait_for(worker.run(), 30)
    finally:
        await engine.dispose()
    async with direct.connect() as conn:
        assert await conn.scalar(text(f"SELECT count(*) FROM {prefix}_jobs")) == 0


@pytest.mark.parametrize("wake", ["pubsub", "lists"])
async def test_a_worker_behind_pgbouncer_is_woken_by_redis_before_its_poll(
    pooled: AsyncEngine, redis_url: str, prefix: str, wake: Any
) -> None:
    state = SqlAlchemyStateAdapter(pooled, table_prefix=f"{prefix}_")
    await state.migrate()
    passes = ClaimPasses(state)
    ran: list[str] = []

    async def handler(job: Any, ctx: Any) -> None:
        ran.append(job.id)

    notify = RedisNotifyAdapter(redis_url, prefix=prefix, wake=wake)
    producer_notify = RedisNotifyAdapter(redis_url, prefix=prefix, wake=wake)
    try:
        async with (
            Client(state=passes, notify=notify) as client,
            Client(state=state, notify=producer_notify) as producer,
            Worker(client, {"t": handler}, poll_interval=60.0),
        ):
            await wait_until(passes.idle, timeout=30)
            # Its first poll found nothing and is over: only a wakeup brings the job
            # before 60 s.
            chain = await producer.start_chain("t")
            done = await producer.await_chain(chain.id, timeout=30)
            assert done.status == "completed"
            assert ran == [done.last_job.id]
    finally:
        await delete_prefix(redis_url, prefix)


def test_a_postgres_listen_connection_through_pgbouncer_is_reported(
    bouncer: Bouncer, postgres_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def listen(**options: Any) -> None:
        adapter = PostgresNotifyAdapter(bouncer.url("psycopg"), prefix=prefix, **options)
        try:
            await adapter.listen_job_scheduled(["t"], lambda _: None)
            await adapter.notify_jobs_scheduled({"t": 1})
        finally:
            await adapter.close()

    with caplog.at_level(logging.WARNING, logger="queuert_notify.notify.postgres"):
        asyncio.run(listen())
        assert any("listen_url" in r.getMessage() for r in caplog.records)
        caplog.clear()
        asyncio.run(listen(listen_url=postgres_url))
        assert not any("listen_url" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_eight_worker_processes_share_ten_server_connections(
    bouncer: Bouncer,
    driver: str,
    direct: AsyncEngine,
    redis_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    total, processes = 400, 8
    async with worker_fleet(
        bouncer,
        driver,
        direct,
        redis_url=redis_url,
        prefix=prefix,
        processes=processes,
        concurrency=10,
        log_dir=tmp_path,
    ) as fleet:
        async with Client(
            state=fleet.state, notify=RedisNotifyAdapter(redis_url, prefix=prefix)
        ) as producer:
            began = time.monotonic()
            for start in range(0, total, 20):
                await producer.start_chains(
                    [ChainSpec("effect", {"n": n}) for n in range(start, start + 20)]
                )

            async def all_completed() -> bool:
                return (await producer.count_jobs()).get("completed", 0) == total

            await wait_until(all_completed, timeout=180, interval=0.2)
            elapsed = time.monotonic() - began
        async with direct.connect() as conn:
            rows, distinct = (
                await conn.execute(
                    select(func.count(), func.count(fleet.effects.c.job_id.distinct()))
                )
            ).one()
        assert (rows, distinct) == (total, total)  # every job's effect committed once
        assert 0 < fleet.most <= 10
        print(
            f"{driver}: {total} jobs by {processes} processes x 10 slots through PgBouncer "
            f"in {elapsed:.1f}s; at most {fleet.most} server connections"
        )
