"""Flaky transports under a running queue: notify calls and SQL statements that fail in
seeded bursts. Every chain still completes, and every job completes exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Handler, Job, JobContext
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.worker import Worker, WorkerMode
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.fault_injection import FaultSchedule, FlakyNotifyAdapter, faulty_engine
from tests.support.queue_helpers import STATE_KINDS

pytest_plugins = ["tests.support.queue_fixtures"]

CHAINS = 50
STEPS = ("fetch", "transform", "store")
"""Each chain runs these three jobs, the first two ending with ``continue_with``."""


@pytest.fixture
async def effects(engine: AsyncEngine, table_prefix: str) -> AsyncIterator[Table]:
    """An application table: one row per job whose handler wrote through ctx.session."""
    table = Table(f"{table_prefix}app_effects", MetaData(), Column("job_id", String(64)))
    async with engine.begin() as conn:
        await conn.run_sync(table.create)
    yield table  # dropped with the test's other prefixed tables


class Tally:
    """What the handlers and workers did, per job."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()

    def on_event(self, event: WorkerEvent) -> None:
        if event.kind == "completed":
            self.completed[event.job_id] += 1

    def handlers(self, effects: Table | None) -> dict[str, Handler]:
        """Three steps; with ``effects``, each writes one row in the completion's
        transaction (atomic mode)."""

        async def step(job: Job, ctx: JobContext) -> Any:
            self.runs[job.id] += 1
            if effects is not None:
                await ctx.session.execute(insert(effects).values(job_id=job.id))
            following = STEPS.index(job.type_name) + 1
            if following < len(STEPS):
                return ctx.continue_with(STEPS[following], job.input)
            return {"chain": job.input}

        return dict.fromkeys(STEPS, step)


async def _assert_every_chain_completed_once(
    client: Client, chain_ids: list[str], tally: Tally
) -> list[str]:
    """Every chain completed with its output and exactly len(STEPS) jobs, each completed
    once; returns the ids of all the chains' jobs."""
    # The bound only rules out a chain that never completes: under a loaded machine the
    # injected bursts (each a reconnect) make 150 jobs take over 30 s; the test's own
    # timeout is 120 s.
    results = await asyncio.gather(
        *(client.await_chain(chain_id, timeout=90, poll_interval=0.2) for chain_id in chain_ids)
    )
    assert sorted(r.output["chain"] for r in results) == list(range(CHAINS))
    job_ids: list[str] = []
    for chain_id in chain_ids:
        jobs = (await client.list_jobs(chain_id=chain_id)).items
        assert [(j.type_name, j.status) for j in jobs] == [(s, "completed") for s in STEPS]
        job_ids += [j.id for j in jobs]
    assert tally.completed == dict.fromkeys(job_ids, 1)
    return job_ids


async def _start_chains(client: Client, engine: AsyncEngine) -> list[str]:
    """Half the chains in the caller's own transactions (published after COMMIT), half
    in one batch through the client's own transaction."""
    half = CHAINS // 2
    chain_ids = []
    async with AsyncSession(engine) as session:
        for n in range(half):
            async with session.begin():
                chain_ids.append((await client.start_chain(STEPS[0], n, session=session)).id)
    started = await client.start_chains([ChainSpec(STEPS[0], n) for n in range(half, CHAINS)])
    return chain_ids + [chain.id for chain in started]


async def _effect_rows(engine: AsyncEngine, effects: Table) -> Counter[str]:
    async with engine.connect() as conn:
        return Counter((await conn.execute(select(effects.c.job_id))).scalars())


@pytest.mark.parametrize("notify_kind", ["in_process", "redis"], indirect=True)
async def test_every_chain_completes_exactly_once_while_notify_calls_fail_in_bursts(
    state: Any, notify: NotifyAdapter, engine: AsyncEngine, effects: Table
) -> None:
    schedule = FaultSchedule(seed=5)
    tally = Tally()
    async with Client(state=state, notify=FlakyNotifyAdapter(notify, schedule)) as client:
        options: dict[str, Any] = {"concurrency": 5, "poll_interval": 0.3, "mode": "atomic"}
        async with (
            Worker(client, tally.handlers(effects), on_event=tally.on_event, **options),
            Worker(client, tally.handlers(effects), on_event=tally.on_event, **options),
        ):
            # Armed once the workers listen: a transport that is down at start is a
            # server fault of its own (docs/reliability.md, "Server faults").
            schedule.armed = True
            chain_ids = await _start_chains(client, engine)
            job_ids = await _assert_every_chain_completed_once(client, chain_ids, tally)
        schedule.armed = False
    assert tally.runs == dict.fromkeys(job_ids, 1)
    assert await _effect_rows(engine, effects) == dict.fromkeys(job_ids, 1)
    hot_path = {
        "notify_jobs_scheduled",  # after the client's and the workers' commits
        "consume_wake_hint",
        "notify_chain_completed",
        "listen_job_ownership_lost",  # once per running job
        "listen_chain_completed",  # await_chain
        "unsubscribe",
    }
    assert hot_path <= set(schedule.injected), schedule.injected


@pytest.fixture
def flaky_state(
    database_url: str, table_prefix: str, state: Any
) -> Iterator[tuple[SqlAlchemyStateAdapter, FaultSchedule]]:
    """A state adapter on an engine of its own whose statements fail in bursts once the
    schedule is armed (the test's ``client`` keeps a reliable engine to check with)."""
    schedule = FaultSchedule(seed=6, rate=0.08)
    engine, remove = faulty_engine(database_url, schedule, pool_size=12)
    yield SqlAlchemyStateAdapter(engine, table_prefix=table_prefix), schedule
    remove()


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
@pytest.mark.parametrize("mode", ["atomic", "staged"])
async def test_every_chain_completes_exactly_once_while_state_statements_fail_in_bursts(
    client: Client,
    engine: AsyncEngine,
    effects: Table,
    flaky_state: tuple[SqlAlchemyStateAdapter, FaultSchedule],
    mode: WorkerMode,
) -> None:
    worker_state, schedule = flaky_state
    # The workers' client shares the notify adapter; the test's client owns and closes it.
    worker_client = Client(state=worker_state, notify=client.notify)
    tally = Tally()
    handlers = tally.handlers(effects if mode == "atomic" else None)
    options: dict[str, Any] = {
        "concurrency": 5,
        "poll_interval": 0.3,
        # The outcome of a finished handler is rewritten until the lease expires.
        "lease": 30.0,
        "mode": mode,
        "retry_backoff": lambda attempt: 0.05,
        "on_event": tally.on_event,
    }
    try:
        async with (
            Worker(worker_client, handlers, **options),
            Worker(worker_client, handlers, **options),
        ):
            schedule.armed = True
            chain_ids = await _start_chains(client, engine)
            job_ids = await _assert_every_chain_completed_once(client, chain_ids, tally)
        schedule.armed = False
    finally:
        await worker_state.engine.dispose()
    assert schedule.injected["statement"] >= 20, schedule.injected
    if mode == "atomic":
        # A dropped connection under the handler's session fails that attempt, whose
        # writes roll back with it; the retry writes them once.
        assert await _effect_rows(engine, effects) == dict.fromkeys(job_ids, 1)
    else:
        # Completions that fail to write are retried while the lease holds: no handler
        # runs twice.
        assert tally.runs == dict.fromkeys(job_ids, 1)
