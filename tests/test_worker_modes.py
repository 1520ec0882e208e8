"""Atomic mode: the handler's writes share the completion's transaction. Staged mode:
no transaction around the handler, completions batched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.errors import ConfigurationError
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker
from state_adapters.base import StateAdapterBase
from tests.support.queue_helpers import STATE_KINDS, CountingState, job_events, wait_until

pytest_plugins = ["tests.support.queue_fixtures"]


@pytest.fixture
async def notes(engine: AsyncEngine, table_prefix: str) -> AsyncIterator[Table]:
    """An application table of the test's own, next to the queue's tables."""
    table = Table(f"{table_prefix}app_notes", MetaData(), Column("job_id", String(64)))
    async with engine.begin() as conn:
        await conn.run_sync(table.create)
    yield table  # dropped with the test's other prefixed tables


def _completion_writes(counting: CountingState) -> int:
    """Transactions that wrote completions: alone, or along with the next claim."""
    return counting.calls.get("complete_jobs", 0) + counting.calls.get("complete_and_acquire", 0)


async def _note_count(engine: AsyncEngine, notes: Table) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(notes))).scalar_one())


async def test_atomic_handler_writes_commit_with_the_completion_and_continuation(
    client: Client, engine: AsyncEngine, notes: Table
) -> None:
    async def first(job: Job, ctx: JobContext) -> Any:
        await ctx.session.execute(insert(notes).values(job_id=job.id))
        return ctx.continue_with("second")

    async def second(job: Job, ctx: JobContext) -> str:
        await ctx.session.execute(insert(notes).values(job_id=job.id))
        return "both written"

    chain = await client.start_chain("first")
    async with Worker(client, {"first": first, "second": second}, mode="atomic"):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.output == "both written"
    assert await _note_count(engine, notes) == 2


async def test_atomic_handler_writes_roll_back_when_the_handler_fails(
    client: Client, engine: AsyncEngine, notes: Table
) -> None:
    async def handler(job: Job, ctx: JobContext) -> None:
        await ctx.session.execute(insert(notes).values(job_id=job.id))
        raise RuntimeError("after writing")

    chain = await client.start_chain("t", max_attempts=2)
    async with Worker(client, {"t": handler}, retry_backoff=lambda attempt: 0.01):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert await _note_count(engine, notes) == 0


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
async def test_atomic_writes_that_fail_at_commit_fail_the_attempt(
    client: Client, engine: AsyncEngine, table_prefix: str
) -> None:
    class Base(DeclarativeBase):
        pass

    class Invoice(Base):
        __tablename__ = f"{table_prefix}app_invoices"
        id: Mapped[int] = mapped_column(primary_key=True)
        number: Mapped[str] = mapped_column(String(20), unique=True)

    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    async with AsyncSession(engine) as session, session.begin():
        session.add(Invoice(number="INV-1"))

    async def handler(job: Job, ctx: JobContext) -> str:
        # Flushed only at COMMIT, together with the completion: the unique index refuses it.
        ctx.session.add(Invoice(number=job.input["number"]))
        return "invoiced"

    events: list[WorkerEvent] = []
    chain = await client.start_chain("invoice", {"number": "INV-1"}, max_attempts=2)
    async with Worker(
        client,
        {"invoice": handler},
        retry_backoff=lambda attempt: 0.01,
        on_event=job_events(events),
    ):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert "IntegrityError" in (done.last_job.last_error or "")
    assert [e.kind for e in events if e.kind != "started"] == ["retried", "failed"]


# Postgres only: on SQLite the handler's open write transaction holds the single write
# lock, so the cancel waits for the completion instead of racing it.
@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["noop"], indirect=True)
async def test_atomic_handler_writes_are_discarded_when_ownership_was_lost(
    client: Client, engine: AsyncEngine, notes: Table
) -> None:
    events: list[WorkerEvent] = []
    written = asyncio.Event()
    proceed = asyncio.Event()

    async def handler(job: Job, ctx: JobContext) -> str:
        await ctx.session.execute(insert(notes).values(job_id=job.id))
        written.set()
        await proceed.wait()
        return "too late"

    chain = await client.start_chain("t")
    async with Worker(client, {"t": handler}, lease=30, on_event=job_events(events)):
        await asyncio.wait_for(written.wait(), 5)
        # Another actor takes over (no notification reaches the worker: noop adapter).
        cancel = asyncio.create_task(client.cancel_chain(chain.id))
        await asyncio.sleep(0.2)
        proceed.set()
        await cancel
        await wait_until(lambda: len(events) == 2, timeout=10)
    assert [e.kind for e in events] == ["started", "ownership_lost"]
    assert (await client.get_chain(chain.id)).status == "cancelled"
    assert await _note_count(engine, notes) == 0


async def test_staged_handler_has_no_session(client: Client) -> None:
    errors: list[BaseException] = []

    async def handler(job: Job, ctx: JobContext) -> str:
        try:
            ctx.session  # noqa: B018
        except ConfigurationError as exc:
            errors.append(exc)
        return "ok"

    chain = await client.start_chain("t")
    async with Worker(client, {"t": handler}, mode="staged"):
        await client.await_chain(chain.id, timeout=5)
    assert len(errors) == 1
    assert "atomic" in str(errors[0])


@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_completions_finishing_together_share_a_transaction(
    state: Any, notify: NotifyAdapter, mode: str
) -> None:
    counting = CountingState(state)
    async with Client(state=counting, notify=notify) as client:

        async def handler(job: Job, ctx: JobContext) -> int:
            await asyncio.sleep(0.01)
            return int(job.input)

        chains = await client.start_chains([ChainSpec("t", n) for n in range(200)])
        async with Worker(client, {"t": handler}, concurrency=50, mode=mode):  # type: ignore[arg-type]
            for chain in chains:
                await client.await_chain(chain.id, timeout=30)
    assert _completion_writes(counting) < 100


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
async def test_atomic_jobs_running_together_commit_independently(
    state: Any, notify: NotifyAdapter, engine: AsyncEngine, notes: Table
) -> None:
    counting = CountingState(state)

    async def handler(job: Job, ctx: JobContext) -> int:
        n: int = job.input
        if n % 3 == 0:
            ctx.session  # noqa: B018  # taken, never written through
        elif n % 3 == 1:
            await ctx.session.execute(insert(notes).values(job_id=job.id))
        if n == 4:
            raise RuntimeError("fails after writing")
        return n

    async with Client(state=counting, notify=notify) as client:
        chains = await client.start_chains([ChainSpec("t", n, max_attempts=1) for n in range(30)])
        async with Worker(client, {"t": handler}, concurrency=10, mode="atomic"):
            done = [await client.await_chain(chain.id, timeout=30) for chain in chains]
    assert [d.status for d in done] == ["failed" if n == 4 else "completed" for n in range(30)]
    async with engine.connect() as conn:
        written = set((await conn.execute(select(notes.c.job_id))).scalars())
    # Each writer's rows committed with exactly its own completion; the failed job's
    # rolled back alone.
    assert written == {chains[n].id for n in range(30) if n % 3 == 1 and n != 4}
    # The 9 writers that completed committed alone; the 20 others shared batches,
    # the 10 that took ctx.session without writing through it included.
    assert _completion_writes(counting) <= 9 + 10


class _ProtocolOnly(StateAdapterBase):
    """The real state adapter with the base class's defaults for the worker-loop
    capabilities (no combined claim and completion, no connections kept, no handler
    transactions), as a state adapter of the user's own would have."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
async def test_a_state_adapter_with_only_the_protocol_drains_too(
    state: Any, notify: NotifyAdapter
) -> None:
    async def handler(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("second", job.input) if job.type_name == "first" else job.input

    async with Client(state=_ProtocolOnly(state), notify=notify) as client:
        chains = await client.start_chains([ChainSpec("first", n) for n in range(40)])
        async with Worker(client, {"first": handler, "second": handler}, mode="staged"):
            done = [await client.await_chain(chain.id, timeout=30) for chain in chains]
    assert [d.output for d in done] == list(range(40))
