"""The claim's plan does not depend on statistics: on a jobs table that was never
analyzed (or analyzed while it was empty) and then filled with 20,000 pending jobs, a
claim of one type or of several reads the acquire index in claim order and sorts no
more than the few candidates it read, never the backlog; and it reads as many pages
as the same claim on a freshly analyzed table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks import claim_plan
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.queue_helpers import drop_tables

pytestmark = pytest.mark.timeout(180)

BACKLOG = 20_000
LIMIT = 10
TYPES = ["email", "report"]


@pytest.fixture
async def state(postgres_url: str, prefix: str) -> AsyncIterator[SqlAlchemyStateAdapter]:
    engine = create_async_engine(postgres_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    async with engine.begin() as conn:
        # Kept from being analyzed behind the test's back.
        await conn.execute(text(f"ALTER TABLE {prefix}_jobs SET (autovacuum_enabled = false)"))
    try:
        yield state
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()


async def fill(state: SqlAlchemyStateAdapter) -> None:
    for first in range(0, BACKLOG, 1_000):
        chains = [NewChain(NewJob(TYPES[n % 2], {"n": n})) for n in range(first, first + 1_000)]
        await state.start_chains(chains, notes=NotificationBuffer())


async def explain_claim(state: SqlAlchemyStateAdapter, types: list[str]) -> dict[str, Any]:
    """The plan of the claim the adapter sends, with the pages each node read."""
    document = await claim_plan.explain_claim(state, types, LIMIT, buffers=True)
    return dict(document["Plan"])


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


def check_plan(plan: dict[str, Any], jobs_table: str, types: list[str]) -> None:
    scans = [
        n
        for n in nodes(plan)
        if n.get("Relation Name") == jobs_table and n["Node Type"] != "ModifyTable"
    ]
    used = {(n["Node Type"], n.get("Index Name")) for n in scans}
    assert used <= {
        ("Index Scan", f"{jobs_table}_acquire_ix"),
        ("Index Scan", f"{jobs_table}_pkey"),
    }, used
    for sort in (n for n in nodes(plan) if n["Node Type"] == "Sort"):
        (child,) = sort["Plans"]
        sorted_rows = child["Actual Rows"] * child["Actual Loops"]
        assert sorted_rows <= len(types) * LIMIT, f"sorted {sorted_rows} rows"
    claimed = plan["Actual Rows"]
    assert claimed == LIMIT


def pages_read(plan: dict[str, Any]) -> int:
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


@pytest.mark.parametrize("analyzed_empty", [False, True], ids=["never-analyzed", "analyzed-empty"])
async def test_claims_read_the_acquire_index_without_statistics_of_the_backlog(
    state: SqlAlchemyStateAdapter, prefix: str, analyzed_empty: bool
) -> None:
    jobs_table = f"{prefix}_jobs"
    if analyzed_empty:
        async with state.engine.connect() as conn:
            await conn.execute(text(f"ANALYZE {jobs_table}"))
            await conn.commit()
    await fill(state)
    async with state.engine.connect() as conn:
        analyzed = await conn.scalar(
            text(
                "SELECT coalesce(last_analyze, last_autoanalyze) FROM pg_stat_user_tables "
                "WHERE relname = :name"
            ),
            {"name": jobs_table},
        )
    assert (analyzed is not None) == analyzed_empty
    stale = {}
    for types in (TYPES[:1], TYPES):
        plan = await explain_claim(state, types)
        check_plan(plan, jobs_table, types)
        stale[len(types)] = pages_read(plan)
    async with state.engine.connect() as conn:
        await conn.execute(text(f"ANALYZE {jobs_table}"))
        await conn.commit()
    for types in (TYPES[:1], TYPES):
        plan = await explain_claim(state, types)
        check_plan(plan, jobs_table, types)
        # No more pages than with fresh statistics (a sort of the backlog reads them all).
        assert stale[len(types)] <= pages_read(plan) * 1.25 + 10, (stale, pages_read(plan))
