"""A held xmin horizon for tests: another connection with a REPEATABLE READ snapshot
left open, and jobs churned through the state adapter meanwhile."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer

holds_the_horizon = pytest.mark.xdist_group("held_horizon")
"""The mark of a test that holds a snapshot open for seconds: vacuum removes no dead row
of this database meanwhile, so tests that check vacuum got through (the report back to
"ok") must not run beside one. With ``--dist loadgroup`` they all run on one xdist
worker, one after another; other tests hold a snapshot a moment at most, which the
checks wait out."""


async def held_snapshot(postgres_url: str, *queries: str) -> psycopg.AsyncConnection[Any]:
    """Another connection with a REPEATABLE READ transaction left open after
    ``queries`` (default ``SELECT 1``), as an analytics job or a shell would."""
    dsn = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    conn = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name="analytics-report"
    )
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    for query in queries or ("SELECT 1",):
        await conn.execute(query)  # type: ignore[arg-type]
    return conn


async def churn(state: SqlAlchemyStateAdapter, count: int, type_name: str = "churn") -> None:
    """Start, claim and complete ``count`` jobs through the adapter."""
    notes = NotificationBuffer()
    for first in range(0, count, 500):
        chains = [NewChain(NewJob(type_name, {"n": n})) for n in range(first, first + 500)]
        await state.start_chains(chains, notes=notes)
        while jobs := await state.acquire([type_name], worker_id="w", lease_seconds=60, limit=100):
            done = [Completion(j.id, j.lease_token or "", {"ok": True}) for j in jobs]
            await state.complete_jobs(done, notes=notes)
