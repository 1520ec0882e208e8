"""A number that is a job's whole input, output or progress comes back as the number
given on SQLite: the same value and the same type (``1.0`` stays a float, ``-0.0``
keeps its sign). (Postgres keeps the value; ``jsonb`` holds numbers as decimals, so a
float without a fraction may come back as an int: ``tests/support/json_values.py``.)

SQLite's declared column type decides what it does to a value (type affinity). A column
declared ``JSON`` has NUMERIC affinity: SQLite turned the JSON text of a bare number into
a REAL or an INTEGER, and gave back ``3.505814728493874e-295`` for
``3.5058147284938744e-295`` (its text-to-double conversion is not always the nearest
double), ``1`` for ``1.0``, ``0`` for ``-0.0``. The queue's JSON columns are declared
``TEXT`` (migration 0011 rebuilds older tables). Numbers inside a list or an object were
never touched: the column held the document's text.

Each value travels every way a document is written and read on SQLite: a start on the
driver's own path (:mod:`state_adapters.sqlite.driver`) and one in the caller's session
(SQLAlchemy), the claim that hands it to a handler, a continuation, progress and the
worker's completion (the driver again), ``complete_chain`` and ``SyncClient``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.client.client import Client
from queuert_notify.client.sync_client import SyncClient
from queuert_notify.jobs import Job, JobContext
from queuert_notify.testing import run_until_idle

pytest_plugins = ["tests.support.queue_fixtures"]

NUMBERS: list[Any] = [
    3.5058147284938744e-295,  # SQLite read its text back one bit off (hypothesis found it)
    5e-324,  # the smallest subnormal double
    1.7976931348623157e308,  # the largest double
    0.1 + 0.2,  # 0.30000000000000004
    -0.0,
    1.0,  # a float with an integer's value: NUMERIC affinity stored an INTEGER
    1e16,
    2.0**63,  # just past SQLite's 64-bit integers
    1e300,
    2**63 - 1,  # the largest integer the queue accepts
    -(2**63),
    10**18,
    0,
]


def _exactly(given: Any, read_back: Any) -> bool:
    """The same number: type and shortest repr (which tells -0.0 from 0.0)."""
    return type(read_back) is type(given) and repr(read_back) == repr(given)


def _differences(given: list[Any], read_back: list[Any]) -> list[tuple[Any, Any]]:
    return [(a, b) for a, b in zip(given, read_back, strict=True) if not _exactly(a, b)]


async def test_a_bare_number_keeps_its_value_and_type_through_a_worker(
    client: Client, engine: AsyncEngine
) -> None:
    async def first(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("echo", job.input)

    async def echo(job: Job, ctx: JobContext) -> Any:
        await ctx.set_progress(job.input)
        return job.input

    started = [(await client.start_chain("first", n)).id for n in NUMBERS]
    async with AsyncSession(engine) as session, session.begin():
        in_session = [(await client.start_chain("first", n, session=session)).id for n in NUMBERS]
    await run_until_idle(client, {"first": first, "echo": echo})
    for chain_ids in (started, in_session):
        chains = [await client.get_chain(chain_id) for chain_id in chain_ids]
        first_jobs = [await client.get_job(chain_id) for chain_id in chain_ids]
        assert _differences(NUMBERS, [job.input for job in first_jobs]) == []
        assert _differences(NUMBERS, [chain.last_job.input for chain in chains]) == []
        assert _differences(NUMBERS, [chain.last_job.progress for chain in chains]) == []
        assert _differences(NUMBERS, [chain.output for chain in chains]) == []


async def test_a_bare_number_keeps_its_value_and_type_as_an_output_given_by_the_application(
    client: Client,
) -> None:
    chain_ids = [(await client.start_chain("approval")).id for _ in NUMBERS]
    completed = [
        await client.complete_chain(chain_id, n)
        for chain_id, n in zip(chain_ids, NUMBERS, strict=True)
    ]
    assert _differences(NUMBERS, [chain.output for chain in completed]) == []
    read_back = [await client.get_chain(chain_id) for chain_id in chain_ids]
    assert _differences(NUMBERS, [chain.output for chain in read_back]) == []


def test_a_bare_number_keeps_its_value_and_type_through_the_sync_client(
    sync_engine: Engine, table_prefix: str
) -> None:
    with SyncClient(sync_engine, table_prefix=table_prefix) as client:
        chain_ids = [client.start_chain("t", n).id for n in NUMBERS]
        assert _differences(NUMBERS, [client.get_job(c).input for c in chain_ids]) == []
        for chain_id, n in zip(chain_ids, NUMBERS, strict=True):
            client.complete_chain(chain_id, n)
        assert _differences(NUMBERS, [client.get_chain(c).output for c in chain_ids]) == []
