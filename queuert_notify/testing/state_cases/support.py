"""Helpers and data shared by the state-adapter conformance cases."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from state_adapters.model import Completion, JobRecord, NewChain, NewJob, StartedChain
from state_adapters.notifications import NotificationBuffer

SHORT_LEASE = 0.3
"""Seconds; tests that need a lease to expire sleep a little longer than this."""


async def start(
    state: Any, type_name: str = "t", input: Any = None, **options: Any
) -> StartedChain:
    """Start one chain (``options``: NewChain fields, or NewJob fields)."""
    job_fields = {
        k: options.pop(k)
        for k in ("run_at", "priority", "max_attempts", "concurrency_key")
        if k in options
    }
    chain = NewChain(NewJob(type_name, input, **job_fields), **options)
    started: StartedChain
    (started,) = await state.start_chains([chain], notes=NotificationBuffer())
    return started


async def claim(
    state: Any,
    types: Sequence[str] = ("t",),
    *,
    limit: int = 1,
    lease: float = 30.0,
    worker: str = "worker-1",
) -> list[JobRecord]:
    return list(
        await state.acquire(list(types), worker_id=worker, lease_seconds=lease, limit=limit)
    )


async def claim_one(state: Any, types: Sequence[str] = ("t",), **kwargs: Any) -> JobRecord:
    jobs = await claim(state, types, **kwargs)
    assert len(jobs) == 1, f"expected one claimable job of {list(types)}, got {jobs}"
    return jobs[0]


async def complete(state: Any, job: JobRecord, output: Any = None) -> JobRecord:
    (result,) = await state.complete_jobs(
        [Completion(job.id, token(job), output=output)], notes=NotificationBuffer()
    )
    assert isinstance(result, JobRecord), result
    return result


def token(job: JobRecord) -> str:
    """The lease token of a claimed job."""
    assert job.lease_token is not None, f"job {job.id} is not leased"
    return job.lease_token


async def total_jobs(state: Any) -> int:
    return sum((await state.count_jobs()).values())


def engine_of(state: Any) -> AsyncEngine:
    engine = getattr(state, "engine", None)
    if not isinstance(engine, AsyncEngine):
        pytest.skip("the adapter has no `engine` attribute (AsyncEngine) for session tests")
    return engine


JSON_SHAPES: list[Any] = [
    None,
    True,
    0,
    -7,
    1.5,
    # Doubles a database must not round: SQLite read the first back one bit off while it
    # kept a bare number in a column of NUMERIC affinity (before migration 0011).
    3.5058147284938744e-295,
    5e-324,
    0.1 + 0.2,
    "text",
    "",
    [],
    [1, 2],
    [[1], [2, [3]]],
    [None],
    {},
    {"nested": {"list": [1, {"x": None}]}, "unicode": "h\u00e9llo \u2603"},
]


class _NotJson:
    pass


BAD_INPUTS = [
    pytest.param(_NotJson(), id="object"),
    pytest.param({"x": float("nan")}, id="nan"),
    pytest.param({"x": float("inf")}, id="infinity"),
    pytest.param({1, 2}, id="set"),
    pytest.param({"at": datetime(2030, 1, 1, tzinfo=UTC)}, id="datetime"),
    pytest.param(b"bytes", id="bytes"),
]
