"""Faults the Postgres adapter survives: a terminated LISTEN backend, a terminated
publishing backend; and close() leaves nothing running, whatever state it is in."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from queuert_notify import PostgresNotifyAdapter
from queuert_notify.testing import Recorder
from tests.support.backoff_checks import assert_backoff_grows
from tests.support.queue_helpers import other_tasks
from tests.support.tcp_proxy import TcpProxy
from tests.test_postgres_notify import libpq_dsn, listener_backends


async def _terminate(postgres_url: str, pids: list[int]) -> None:
    async with await psycopg.AsyncConnection.connect(
        libpq_dsn(postgres_url), autocommit=True
    ) as admin:
        for pid in pids:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_terminated_listen_backend_is_replaced_relistened_and_reported(
    postgres_url: str, prefix: str
) -> None:
    async with (
        PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter,
        PostgresNotifyAdapter(postgres_url, prefix=prefix) as publisher,
    ):
        reconnects = Recorder()
        adapter.on_reconnect(reconnects)
        scheduled, completed, lost = Recorder(), Recorder(), Recorder()
        await adapter.listen_job_scheduled(["t"], scheduled)
        await adapter.listen_chain_completed("c", completed)
        await adapter.listen_job_ownership_lost("j", lost)
        [old_pid] = await listener_backends(postgres_url, prefix)

        await _terminate(postgres_url, [old_pid])
        await reconnects.wait_for(1, within=10.0)

        [new_pid] = await listener_backends(postgres_url, prefix)
        assert new_pid != old_pid
        await publisher.notify_jobs_scheduled({"t": 1})
        await publisher.notify_chain_completed("c")
        await publisher.notify_job_ownership_lost("j")
        await scheduled.wait_for(1, within=5.0)
        await completed.wait_for(1, within=5.0)
        await lost.wait_for(1, within=5.0)
        assert len(reconnects.calls) == 1, "one signal per restored loss"


async def test_a_listener_added_after_the_loss_hears_too(postgres_url: str, prefix: str) -> None:
    async with (
        PostgresNotifyAdapter(postgres_url, prefix=prefix) as adapter,
        PostgresNotifyAdapter(postgres_url, prefix=prefix) as publisher,
    ):
        reconnects = Recorder()
        adapter.on_reconnect(reconnects)
        first, second = Recorder(), Recorder()
        await adapter.listen_chain_completed("first", first)
        await _terminate(postgres_url, await listener_backends(postgres_url, prefix))
        # Races the recovery on purpose: whichever reopens the connection LISTENs both.
        await adapter.listen_chain_completed("second", second)
        await reconnects.wait_for(1, within=10.0)

        await publisher.notify_chain_completed("first")
        await publisher.notify_chain_completed("second")
        await first.wait_for(1, within=5.0)
        await second.wait_for(1, within=5.0)


async def test_a_terminated_publishing_backend_is_replaced_transparently(
    postgres_url: str, prefix: str
) -> None:
    # An application_name in the DSN wins over the adapter's default: it marks
    # this adapter's sessions among everyone else's.
    named = f"{postgres_url}{'&' if '?' in postgres_url else '?'}application_name={prefix}"
    async with PostgresNotifyAdapter(named) as adapter:
        rec = Recorder()
        await adapter.listen_chain_completed("c", rec)
        await adapter.notify_chain_completed("c")
        await rec.wait_for(1, within=5.0)
        sessions = await _sessions_named(postgres_url, prefix)
        [publisher] = set(sessions) - set(await listener_backends(postgres_url, "queuert"))
        await _terminate(postgres_url, [publisher])

        await adapter.notify_chain_completed("c")
        await rec.wait_for(2, within=5.0)
        assert publisher not in await _sessions_named(postgres_url, prefix)


async def _sessions_named(postgres_url: str, application_name: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(
        libpq_dsn(postgres_url), autocommit=True
    ) as admin:
        cursor = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        )
        return [row[0] for row in await cursor.fetchall()]


async def test_close_leaves_no_task_whether_listening_or_recovering(
    postgres_url: str, prefix: str
) -> None:
    before = other_tasks()
    adapter = PostgresNotifyAdapter(postgres_url, prefix=prefix)
    await adapter.connect()
    await adapter.listen_job_scheduled(["t"], Recorder())
    await adapter.close()
    assert other_tasks() == before

    adapter = PostgresNotifyAdapter(postgres_url, prefix=prefix)
    await adapter.listen_chain_completed("c", Recorder())
    await _terminate(postgres_url, await listener_backends(postgres_url, prefix))
    await asyncio.sleep(0.01)  # the reader notices; the recovery may be mid-attempt
    await adapter.close()
    assert other_tasks() == before
    assert await listener_backends(postgres_url, prefix) == []


async def test_while_postgres_is_unreachable_the_listener_backs_off_then_restores(
    postgres_url: str, prefix: str
) -> None:
    proxy = await TcpProxy.in_front_of(postgres_url)
    via_proxy = proxy.url(postgres_url)
    try:
        async with (
            PostgresNotifyAdapter(via_proxy, prefix=prefix) as adapter,
            PostgresNotifyAdapter(postgres_url, prefix=prefix) as publisher,
        ):
            reconnects = Recorder()
            adapter.on_reconnect(reconnects)
            rec = Recorder()
            await adapter.listen_chain_completed("c", rec)

            proxy.mode = "reset"
            await asyncio.sleep(2.5)
            # Backoff doubles from 50 ms to 2 s: a handful of attempts, ever further apart.
            assert_backoff_grows(proxy.reset_times)
            assert reconnects.calls == []
            # A channel already LISTENed takes new listeners (served once restored);
            # a new channel needs the server and says so.
            during = Recorder()
            await adapter.listen_chain_completed("during", during)
            with pytest.raises(psycopg.OperationalError):
                await adapter.listen_job_scheduled(["t"], Recorder())

            proxy.mode = "forward"
            await reconnects.wait_for(1, within=10.0)
            await publisher.notify_chain_completed("c")
            await publisher.notify_chain_completed("during")
            await rec.wait_for(1, within=5.0)
            await during.wait_for(1, within=5.0)
            assert len(reconnects.calls) == 1
    finally:
        await proxy.close()
