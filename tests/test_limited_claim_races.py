"""Limited claims racing on separate engines (so on separate connections, at once):
``concurrency`` and ``key_concurrency`` hold whatever the interleaving. On Postgres
this is the proof that the one-statement claim (migration 0007's function) counts
the running jobs after it holds the type's lock: a count on the snapshot the call
started with would miss the claims committed while it waited, and claim past the cap.
Also: a claim visits at most ``MAX_KEYS_VISITED`` keys, and the next one goes on from
there.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import await_only

from queuert_notify import NoopNotifyAdapter
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.queue_helpers import STATE_KINDS

pytest_plugins = ["tests.support.queue_fixtures"]
pytestmark = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)

CLAIMERS = 6
TOTAL = 240
KEYS = 8


@pytest.fixture
async def claimers(database_url: str, table_prefix: str, state: Any) -> AsyncIterator[list[Any]]:
    engines = [create_async_engine(database_url) for _ in range(CLAIMERS)]
    try:
        yield [SqlAlchemyStateAdapter(e, table_prefix=table_prefix) for e in engines]
    finally:
        for engine in engines:
            await engine.dispose()


async def _race(claimers: list[Any]) -> tuple[int, int]:
    """Drain the type with every claimer at once; the most jobs held at one instant,
    and the most of one key. A job counts from its claim's return until its completion
    is sent, a subset of the time the database has it running: a count above a cap is
    a claim the database let past it."""
    held: dict[str, str | None] = {}
    most = most_per_key = 0
    done = 0

    async def claim_loop(state: Any, name: str) -> None:
        nonlocal most, most_per_key, done
        while done < TOTAL:
            jobs = await state.acquire(["t"], worker_id=name, lease_seconds=30, limit=2)
            for job in jobs:
                held[job.id] = job.concurrency_key
            most = max(most, len(held))
            most_per_key = max([most_per_key, *Counter(held.values()).values()])
            await asyncio.sleep(0.003)  # hold the jobs while the others claim
            for job in jobs:
                del held[job.id]
            if jobs:
                await state.complete_jobs(
                    [Completion(j.id, j.lease_token) for j in jobs], notes=NotificationBuffer()
                )
                done += len(jobs)

    await asyncio.wait_for(
        asyncio.gather(*(claim_loop(s, f"w{i}") for i, s in enumerate(claimers))), 120
    )
    return most, most_per_key


async def test_racing_claimers_never_exceed_concurrency(state: Any, claimers: list[Any]) -> None:
    await state.start_chains([NewChain(NewJob("t")) for _ in range(TOTAL)], notes=_notes())
    await state.set_limits(
        "t", concurrency=3, key_concurrency=None, rate=None, per_seconds=None, notes=_notes()
    )
    most, _ = await _race(claimers)
    assert most == 3  # reached, never passed


async def test_racing_claimers_never_exceed_concurrency_while_the_rate_window_moves(
    state: Any, claimers: list[Any]
) -> None:
    # A step of the window every millisecond: claims within a step and a step's first
    # claim (which moves the window's entries) race here.
    await state.start_chains([NewChain(NewJob("t")) for _ in range(TOTAL)], notes=_notes())
    await state.set_limits(
        "t", concurrency=3, key_concurrency=None, rate=100_000, per_seconds=0.064, notes=_notes()
    )
    most, _ = await _race(claimers)
    assert most == 3


async def test_racing_claimers_never_exceed_key_concurrency(
    state: Any, claimers: list[Any]
) -> None:
    jobs = [NewChain(NewJob("t", concurrency_key=f"k{n % KEYS}")) for n in range(TOTAL)]
    await state.start_chains(jobs, notes=_notes())
    await state.set_limits(
        "t", concurrency=5, key_concurrency=1, rate=None, per_seconds=None, notes=_notes()
    )
    most, most_per_key = await _race(claimers)
    assert most <= 5 and most_per_key == 1


def _notes() -> NotificationBuffer:
    return NotificationBuffer()


async def test_a_claim_visits_at_most_max_keys_and_the_next_one_goes_on(
    state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound as the SQLite walk and the Postgres function's caller read it.
    monkeypatch.setattr("state_adapters.steps.limited_claims.MAX_KEYS_VISITED", 3)
    monkeypatch.setattr("state_adapters.postgres.statements.MAX_KEYS_VISITED", 3)
    keys = [f"k{n}" for n in range(10)]
    await state.start_chains(
        [NewChain(NewJob("t", concurrency_key=k)) for k in keys], notes=_notes()
    )
    await state.set_limits(
        "t", concurrency=None, key_concurrency=1, rate=None, per_seconds=None, notes=_notes()
    )
    served = []
    for _ in range(4):
        jobs = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=10)
        served.append(sorted(j.concurrency_key for j in jobs))
    assert served == [keys[0:3], keys[3:6], keys[6:9], keys[9:]]


async def test_a_claim_between_an_atomic_completion_and_its_commit_holds_the_type_no_longer(
    state: Any, state_kind: str
) -> None:
    if state_kind == "sqlite":
        pytest.skip("SQLite runs one writer at a time: no claim runs inside a commit")
    await state.start_chains([NewChain(NewJob("t")) for _ in range(2)], notes=_notes())
    await state.set_limits(
        "t", concurrency=1, key_concurrency=None, rate=None, per_seconds=None, notes=_notes()
    )
    [job] = await state.acquire(["t"], worker_id="w", lease_seconds=30, limit=2)
    transaction = state.handler_transaction()
    claimed_meanwhile: list[Any] = []

    def claim_before_commit(_session: Any) -> None:
        # Another worker's claim pass, while the completion is written but not committed:
        # the slot is still taken for it, so it holds the type back.
        claim = state.acquire(["t"], worker_id="w2", lease_seconds=30, limit=1)
        claimed_meanwhile.extend(await_only(claim))

    event.listen(transaction.session.sync_session, "before_commit", claim_before_commit, once=True)
    try:
        completion = Completion(job.id, job.lease_token)
        assert await transaction.complete(state, completion, NoopNotifyAdapter()) is None
    finally:
        await transaction.close()
    assert claimed_meanwhile == []
    # The commit freed the slot: the next job is due now, not at the hold's recheck.
    due = await state.next_due_at(["t"])
    assert due is not None and due <= datetime.now(UTC)
