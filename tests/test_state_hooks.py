"""After-commit notifications: NotificationBuffer and buffer_for_transaction."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

from queuert_notify.notify.in_process import InProcessNotifyAdapter
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import NewChain, NewJob, StartedChain
from state_adapters.notifications import NotificationBuffer, wait_for_notifications
from state_adapters.transactions.after_commit import buffer_for_transaction
from tests.support.queue_helpers import drop_tables, wait_until


class RecordingNotify(InProcessNotifyAdapter):
    """The in-process adapter, with a log of every notify call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        self.calls.append(("scheduled", dict(counts)))
        await super().notify_jobs_scheduled(counts)

    async def notify_chain_completed(self, chain_id: str) -> None:
        self.calls.append(("chain_completed", chain_id))
        await super().notify_chain_completed(chain_id)

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        self.calls.append(("ownership_lost", job_id))
        await super().notify_job_ownership_lost(job_id)


class BrokenNotify(RecordingNotify):
    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        self.calls.append(("scheduled", dict(counts)))
        raise ConnectionError("transport down")


@pytest.fixture
async def notify() -> AsyncIterator[RecordingNotify]:
    adapter = RecordingNotify()
    yield adapter
    await adapter.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def state(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> AsyncIterator[SqlAlchemyStateAdapter]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    else:
        url = request.getfixturevalue("postgres_url")
    engine = create_async_engine(url)
    adapter = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await adapter.migrate()
    try:
        yield adapter
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def enqueue(
    state: SqlAlchemyStateAdapter,
    session: AsyncSession | AsyncConnection,
    notify: RecordingNotify,
    type_name: str,
) -> StartedChain:
    """Start a chain the way the client does: buffer, then write."""
    notes = buffer_for_transaction(session, notify)
    (started,) = await state.start_chains(
        [NewChain(NewJob(type_name))], notes=notes, session=session
    )
    return started


# -- the buffer itself --------------------------------------------------------------------


async def test_flush_sends_one_scheduled_call_for_all_types_then_the_others(
    notify: RecordingNotify,
) -> None:
    notes = NotificationBuffer()
    notes.job_scheduled("a")
    notes.ownership_lost("j1")
    notes.job_scheduled("b", 3)
    notes.chain_completed("c1")
    notes.job_scheduled("a", 2)
    notes.chain_completed("c1")
    await notes.flush(notify)
    assert notify.calls == [
        ("scheduled", {"a": 3, "b": 3}),
        ("chain_completed", "c1"),
        ("ownership_lost", "j1"),
    ]
    assert len(notes) == 0
    await notes.flush(notify)
    assert len(notify.calls) == 3


async def test_a_failing_transport_is_logged_and_the_rest_still_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    notify = BrokenNotify()
    notes = NotificationBuffer()
    notes.job_scheduled("a")
    notes.chain_completed("c1")
    with caplog.at_level(logging.WARNING, logger="state_adapters.notifications"):
        await notes.flush(notify)
    assert notify.calls == [("scheduled", {"a": 1}), ("chain_completed", "c1")]
    assert "sending a notification failed" in caplog.text
    await notify.close()


async def test_wake_hints_reach_listeners_through_the_in_process_adapter(
    notify: RecordingNotify,
) -> None:
    woken: list[str] = []
    await notify.listen_job_scheduled(["a"], woken.append)
    notes = NotificationBuffer()
    notes.job_scheduled("a", 2)
    await notes.flush(notify)
    assert woken == ["a"]
    assert [await notify.consume_wake_hint("a") for _ in range(3)] == [True, True, False]


# -- ORM sessions -------------------------------------------------------------------------


async def test_notifications_are_sent_after_the_session_commits(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with AsyncSession(state.engine) as session:
        async with session.begin():
            await enqueue(state, session, notify, "a")
            await enqueue(state, session, notify, "a")
            await enqueue(state, session, notify, "b")
            await wait_for_notifications()
            assert notify.calls == []
        await wait_for_notifications()
    # Three writes, one transaction, one round trip.
    assert notify.calls == [("scheduled", {"a": 2, "b": 1})]


async def test_writes_in_one_transaction_share_one_buffer(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with AsyncSession(state.engine) as session, session.begin():
        first = buffer_for_transaction(session, notify)
        assert buffer_for_transaction(session, notify) is first
        assert buffer_for_transaction(session, RecordingNotify()) is not first
    async with AsyncSession(state.engine) as session, session.begin():
        assert buffer_for_transaction(session, notify) is not first


async def test_a_rolled_back_session_sends_nothing(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with AsyncSession(state.engine) as session:
        async with session.begin():
            await enqueue(state, session, notify, "a")
            await session.rollback()
        with pytest.raises(RuntimeError):
            async with session.begin():
                await enqueue(state, session, notify, "b")
                raise RuntimeError("the application changed its mind")
        async with session.begin():
            await enqueue(state, session, notify, "c")
    await wait_for_notifications()
    assert notify.calls == [("scheduled", {"c": 1})]


async def test_a_rolled_back_savepoint_drops_only_its_own_notifications(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with AsyncSession(state.engine) as session, session.begin():
        await enqueue(state, session, notify, "root")
        with pytest.raises(RuntimeError):
            async with session.begin_nested():
                await enqueue(state, session, notify, "dropped")
                raise RuntimeError("undo this part")
        async with session.begin_nested():
            await enqueue(state, session, notify, "released")
        await enqueue(state, session, notify, "after")
    await wait_for_notifications()
    assert notify.calls == [("scheduled", {"root": 1, "released": 1, "after": 1})]


async def test_rolling_back_an_outer_savepoint_drops_what_inner_ones_released(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with AsyncSession(state.engine) as session, session.begin():
        await enqueue(state, session, notify, "root")
        outer = await session.begin_nested()
        async with session.begin_nested():
            await enqueue(state, session, notify, "inner")
        await enqueue(state, session, notify, "outer")
        await outer.rollback()
    await wait_for_notifications()
    assert notify.calls == [("scheduled", {"root": 1})]


# -- Core connections ---------------------------------------------------------------------


async def test_notifications_are_sent_after_the_connection_commits(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with state.engine.connect() as connection:
        async with connection.begin():
            await enqueue(state, connection, notify, "a")
            await enqueue(state, connection, notify, "b")
            await wait_for_notifications()
            assert notify.calls == []
        await wait_for_notifications()
        assert notify.calls == [("scheduled", {"a": 1, "b": 1})]
        transaction = await connection.begin()
        await enqueue(state, connection, notify, "rolled-back")
        await transaction.rollback()
    await wait_for_notifications()
    assert len(notify.calls) == 1


async def test_a_rolled_back_connection_savepoint_drops_its_notifications(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    async with state.engine.connect() as connection, connection.begin():
        await enqueue(state, connection, notify, "root")
        savepoint = await connection.begin_nested()
        await enqueue(state, connection, notify, "dropped")
        await savepoint.rollback()
        async with connection.begin_nested():
            await enqueue(state, connection, notify, "released")
    await wait_for_notifications()
    assert notify.calls == [("scheduled", {"root": 1, "released": 1})]


async def test_a_woken_listener_finds_the_committed_job(
    state: SqlAlchemyStateAdapter, notify: RecordingNotify
) -> None:
    found: list[int] = []

    async def on_scheduled(type_name: str) -> None:
        jobs = await state.acquire([type_name], worker_id="w", lease_seconds=30)
        found.append(len(jobs))

    await notify.listen_job_scheduled(["a"], on_scheduled)
    async with state.engine.connect() as connection, connection.begin():
        await enqueue(state, connection, notify, "a")
    await wait_until(lambda: found)
    assert found == [1]


@pytest.mark.parametrize("kind", ["session", "connection"])
async def test_a_commit_that_fails_sends_nothing(
    postgres_url: str, prefix: str, notify: RecordingNotify, kind: str
) -> None:
    engine = create_async_engine(postgres_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    # A deferred unique constraint is checked at COMMIT, which then fails.
    make_doomed = (
        "CREATE TEMP TABLE doomed (x int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP",
        "INSERT INTO doomed VALUES (1), (1)",
    )
    try:
        if kind == "session":
            with pytest.raises(IntegrityError):
                async with AsyncSession(engine) as session, session.begin():
                    await enqueue(state, session, notify, "a")
                    for statement in make_doomed:
                        await session.execute(text(statement))
        else:
            with pytest.raises(IntegrityError):
                async with engine.connect() as connection, connection.begin():
                    await enqueue(state, connection, notify, "a")
                    for statement in make_doomed:
                        await connection.execute(text(statement))
        await wait_for_notifications()
        assert notify.calls == []
        assert sum((await state.count_jobs()).values()) == 0
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
