"""PostgresNotifyAdapter: the conformance suite, the shared LISTEN connection, DSNs and
engines, publishing inside the caller's transaction, and strangers on our channels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.pool import QueuePool

from queuert_notify import ConfigurationError, InvalidInputError, PostgresNotifyAdapter
from queuert_notify.notify.postgres import MAX_PAYLOAD_BYTES, channel_name
from queuert_notify.testing import NotifyAdapterConformance, Recorder
from queuert_notify.testing.notify_conformance import ForceReconnect


def libpq_dsn(postgres_url: str) -> str:
    """The test URL without its SQLAlchemy driver suffix, for psycopg itself."""
    return postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)


async def listener_backends(postgres_url: str, prefix: str) -> list[int]:
    """Server pids of the sessions whose last statement LISTENed (or UNLISTENed) a channel
    of ``prefix``: the adapter's LISTEN connection, if open."""
    async with await psycopg.AsyncConnection.connect(
        libpq_dsn(postgres_url), autocommit=True
    ) as admin:
        cursor = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s",
            (f'%LISTEN "{prefix}\\_%',),
        )
        return [row[0] for row in await cursor.fetchall()]


class TestPostgresNotifyAdapter(NotifyAdapterConformance):
    supports_hints = False

    @pytest.fixture
    async def adapter(self, postgres_url: str, prefix: str) -> AsyncIterator[PostgresNotifyAdapter]:
        async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
            yield adapter

    @pytest.fixture
    async def peer_adapter(
        self, postgres_url: str, prefix: str
    ) -> AsyncIterator[PostgresNotifyAdapter]:
        async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as peer:
            yield peer

    @pytest.fixture
    async def force_reconnect(
        self, postgres_url: str, prefix: str
    ) -> AsyncIterator[ForceReconnect]:
        async def terminate_listener() -> None:
            pids = await listener_backends(postgres_url, prefix)
            assert pids, "the adapter has no LISTEN connection to lose"
            async with await psycopg.AsyncConnection.connect(
                libpq_dsn(postgres_url), autocommit=True
            ) as admin:
                for pid in pids:
                    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        yield terminate_listener


async def test_one_listen_connection_serves_every_listener_and_closes_with_the_last(
    postgres_url: str, prefix: str
) -> None:
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        assert await listener_backends(postgres_url, prefix) == [], "opened lazily"
        unsubscribes = [
            await adapter.listen_job_scheduled(["a", "b"], Recorder()),
            await adapter.listen_job_scheduled(["a"], Recorder()),
            await adapter.listen_chain_completed("c", Recorder()),
            await adapter.listen_chain_completed("d", Recorder()),
        ]
        assert len(await listener_backends(postgres_url, prefix)) == 1
        for unsubscribe in unsubscribes[:-1]:
            await unsubscribe()
        assert len(await listener_backends(postgres_url, prefix)) == 1
        await unsubscribes[-1]()
        assert await listener_backends(postgres_url, prefix) == [], "released with the last"

        rec = Recorder()
        await adapter.listen_chain_completed("again", rec)
        await adapter.notify_chain_completed("again")
        await rec.wait_for(1, within=5.0)


async def test_the_ownership_lost_channel_stays_listened_until_close(
    postgres_url: str, prefix: str
) -> None:
    """A worker listens for each run's ownership loss and leaves when the run ends: the
    channel is LISTENed once, not once per run, and keeps the connection open."""
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        for job in ("j1", "j2", "j3"):
            unsubscribe = await adapter.listen_job_ownership_lost(job, Recorder())
            await unsubscribe()
        assert len(await listener_backends(postgres_url, prefix)) == 1, "kept with no listener"

        rec = Recorder()
        await adapter.listen_job_ownership_lost("j4", rec)
        await adapter.notify_job_ownership_lost("j4")
        await rec.wait_for(1, within=5.0)
    assert await listener_backends(postgres_url, prefix) == [], "closed with the adapter"


async def test_concurrent_listens_share_one_subscription(postgres_url: str, prefix: str) -> None:
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        recs = [Recorder() for _ in range(20)]
        await asyncio.gather(*(adapter.listen_chain_completed("c", rec) for rec in recs))
        assert len(await listener_backends(postgres_url, prefix)) == 1
        await adapter.notify_chain_completed("c")
        for rec in recs:
            await rec.wait_for(1, within=5.0)


async def test_notify_jobs_scheduled_is_one_statement(postgres_url: str, prefix: str) -> None:
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(["a", "b", "c"], rec)
        async with await psycopg.AsyncConnection.connect(
            libpq_dsn(postgres_url), autocommit=True
        ) as admin:
            # The publisher's last statement names every type at once.
            await adapter.notify_jobs_scheduled({"a": 2, "b": 1, "c": 0})
            await rec.wait_for(2, within=5.0)
            # This adapter's publisher, not another test's (tests run side by side).
            assert adapter._publisher is not None
            cursor = await admin.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s",
                (adapter._publisher.info.backend_pid,),
            )
            [(query,)] = await cursor.fetchall()
            assert "pg_notify" in query and "unnest" in query, "one statement over arrays"
        assert sorted(rec.calls) == [("a",), ("b",)], "a count of 0 announces nothing"


async def test_an_sqlalchemy_engine_is_accepted_and_its_pool_untouched(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url)
    try:
        async with PostgresNotifyAdapter(engine, prefix=prefix) as adapter:
            rec = Recorder()
            await adapter.listen_chain_completed("c", rec)
            await adapter.notify_chain_completed("c")
            await rec.wait_for(1, within=5.0)
            pool = engine.pool
            assert isinstance(pool, QueuePool)
            assert (pool.checkedout(), pool.checkedin()) == (0, 0), "the pool was never used"
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("dsn", "fragment"),
    [
        ("mysql://u@h/db", "scheme"),
        ("postgresql://u@h/db?nonsense_option=1", "invalid Postgres DSN"),
        ("host=h port=5432 dbname", "invalid Postgres DSN"),
    ],
)
def test_bad_dsns_are_configuration_errors(dsn: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        PostgresNotifyAdapter(dsn)


def test_a_sqlite_engine_is_refused() -> None:
    from sqlalchemy import create_engine

    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        PostgresNotifyAdapter(create_engine("sqlite://"))


@pytest.mark.parametrize("prefix", ["", "has space", 'quote"d', "x" * 57])
def test_bad_prefixes_are_configuration_errors(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        PostgresNotifyAdapter("postgresql://u@127.0.0.1/db", prefix=prefix)


async def test_unreachable_server_names_the_address_without_the_password() -> None:
    adapter = PostgresNotifyAdapter(
        "postgresql://alice:s3cret@127.0.0.1:1/jobs", connect_timeout=2.0
    )
    with pytest.raises(ConfigurationError) as caught:
        await adapter.connect()
    message = str(caught.value)
    assert "postgresql://alice@127.0.0.1:1/jobs" in message
    assert "s3cret" not in message
    await adapter.close()


async def test_mixed_case_and_dotted_prefixes_are_quoted(postgres_url: str, prefix: str) -> None:
    odd = f"My.{prefix}-X"
    async with PostgresNotifyAdapter(postgres_url, prefix=odd) as adapter:
        rec = Recorder()
        await adapter.listen_job_scheduled(["t"], rec)
        await adapter.notify_job_scheduled("t")
        await rec.wait_for(1, within=5.0)


async def test_payloads_the_receiver_would_drop_are_refused_before_publishing(
    postgres_url: str, prefix: str
) -> None:
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        with pytest.raises(InvalidInputError):
            await adapter.notify_chain_completed("")
        with pytest.raises(InvalidInputError):
            await adapter.notify_job_scheduled("t" * (MAX_PAYLOAD_BYTES + 1))
        with pytest.raises(InvalidInputError):
            await adapter.notify_jobs_scheduled({"t": -1})


async def test_malformed_payloads_from_strangers_are_ignored_and_counted(
    postgres_url: str, prefix: str
) -> None:
    async with (
        PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter,
        await psycopg.AsyncConnection.connect(libpq_dsn(postgres_url), autocommit=True) as stranger,
    ):
        scheduled, completed = Recorder(), Recorder()
        await adapter.listen_job_scheduled(["t"], scheduled)
        await adapter.listen_chain_completed("c", completed)
        sched, chainc = channel_name(prefix, "sched"), channel_name(prefix, "chainc")

        for garbage in ["", "t" * (MAX_PAYLOAD_BYTES + 1)]:
            await stranger.execute("SELECT pg_notify(%s, %s)", (sched, garbage))
        await stranger.execute("SELECT pg_notify(%s, %s)", (chainc, ""))
        await stranger.execute("SELECT pg_notify(%s, %s)", (sched, '{"type": "t"}'))  # for no one
        await stranger.execute("SELECT pg_notify(%s, %s)", (sched, "t"))
        await stranger.execute("SELECT pg_notify(%s, %s)", (chainc, "c"))

        await scheduled.wait_for(1, within=5.0)
        await completed.wait_for(1, within=5.0)
        assert scheduled.calls == [("t",)]
        assert completed.calls == [()]
        assert adapter.ignored_messages == 3


# -- inside the caller's transaction ---------------------------------------------------


async def _listening(adapter: PostgresNotifyAdapter) -> tuple[Recorder, Recorder, Recorder]:
    scheduled, completed, lost = Recorder(), Recorder(), Recorder()
    await adapter.listen_job_scheduled(["t"], scheduled)
    await adapter.listen_chain_completed("c", completed)
    await adapter.listen_job_ownership_lost("j", lost)
    return scheduled, completed, lost


async def _sentinel(adapter: PostgresNotifyAdapter) -> None:
    """Publish and hear a fresh notification, so anything sent before it has arrived."""
    rec = Recorder()
    unsubscribe = await adapter.listen_chain_completed("sentinel", rec)
    await adapter.notify_chain_completed("sentinel")
    await rec.wait_for(1, within=5.0)
    await unsubscribe()


async def test_notify_in_transaction_is_delivered_on_commit_only(
    postgres_url: str, prefix: str
) -> None:
    engine = create_async_engine(postgres_url)
    try:
        async with PostgresNotifyAdapter(engine, prefix=prefix) as adapter:
            scheduled, completed, lost = await _listening(adapter)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text("SELECT 1"))
                await adapter.notify_in_transaction(
                    session,
                    jobs_scheduled={"t": 1},
                    chains_completed=["c"],
                    jobs_ownership_lost=["j"],
                )
                await _sentinel(adapter)
                assert (scheduled.calls, completed.calls, lost.calls) == ([], [], []), (
                    "nothing is delivered before COMMIT"
                )
            await scheduled.wait_for(1, within=5.0)
            await completed.wait_for(1, within=5.0)
            await lost.wait_for(1, within=5.0)
    finally:
        await engine.dispose()


async def test_notify_in_transaction_is_dropped_on_rollback(postgres_url: str, prefix: str) -> None:
    engine = create_async_engine(postgres_url)
    try:
        async with PostgresNotifyAdapter(engine, prefix=prefix) as adapter:
            scheduled, completed, _ = await _listening(adapter)
            async with engine.connect() as conn:
                await adapter.notify_in_transaction(conn, jobs_scheduled={"t": 1})
                await conn.rollback()
            async with AsyncSession(engine) as session, session.begin():
                savepoint = await session.begin_nested()
                await adapter.notify_in_transaction(session, chains_completed=["c"])
                await savepoint.rollback()
                await adapter.notify_in_transaction(session, jobs_scheduled={"t": 1})
            await scheduled.wait_for(1, within=5.0)  # the one outside the savepoint
            await _sentinel(adapter)
            assert scheduled.calls == [("t",)]
            assert completed.calls == [], "rolled back with its savepoint"
    finally:
        await engine.dispose()


async def test_notify_in_transaction_accepts_a_psycopg_connection(
    postgres_url: str, prefix: str
) -> None:
    async with PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter:
        _, completed, _ = await _listening(adapter)
        conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(
            libpq_dsn(postgres_url)
        )
        async with conn:
            await adapter.notify_in_transaction(conn, chains_completed=["c"])
            await _sentinel(adapter)
            assert completed.calls == []
            await conn.commit()
        await completed.wait_for(1, within=5.0)


async def test_notify_in_transaction_refuses_a_sqlite_session(
    postgres_url: str, prefix: str, tmp_path: Any
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    try:
        async with (
            PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter,
            AsyncSession(engine) as session,
        ):
            with pytest.raises(ConfigurationError, match="PostgreSQL"):
                await adapter.notify_in_transaction(session, chains_completed=["c"])
    finally:
        await engine.dispose()
