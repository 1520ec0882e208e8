"""Issue #1: how fast chains can be started, one per transaction and 100 per transaction.

Four ways, on fresh tables each round:

- ``own tx``: ``client.start_chain(...)`` without a session (the client's own
  transaction, the wakeup published after its commit), one task;
- ``caller tx``: the application's ``AsyncSession`` transaction with one
  ``start_chain(..., session=s)`` in it (the wakeup published from the
  after-commit hook), one task;
- ``own tx, N tasks``: ``--tasks`` tasks doing ``own tx`` at once, as the
  request handlers of a web app would;
- ``100/tx``: ``client.start_chains([...100 specs])`` (one transaction, one
  notify round trip per batch), one task.

On Postgres a ``bare psycopg`` row runs in the same rounds: one-row INSERTs
(autocommit, or between BEGIN and COMMIT for the caller column) and 100-row
``executemany`` transactions into a table of its own, with no queue code. It
is the floor this machine allows at that moment, so a figure below a target
can be read against it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from benchmarks import runner, services, stacks
from queuert_notify.client.chain_spec import ChainSpec

NAME = "start"
HELP = "chains/s started one per transaction and 100 per transaction"

_BATCH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds per combination")
    parser.add_argument("--chains", type=int, default=1000, help="chains started one per tx")
    parser.add_argument("--batches", type=int, default=50, help="transactions of 100 chains")
    parser.add_argument(
        "--tasks", type=int, default=8, help="tasks of the concurrent one-per-tx run"
    )
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip the bare psycopg row"
    )
    stacks.add_stack_arguments(parser)


async def _rate(count: int, start: Callable[[int], Awaitable[object]], tasks: int = 1) -> float:
    """``count`` calls of ``start(index)`` shared by ``tasks`` tasks, per second."""

    async def share(first: int) -> None:
        for index in range(first, count, tasks):
            await start(index)

    began = time.perf_counter()
    await asyncio.gather(*(share(first) for first in range(tasks)))
    return count / (time.perf_counter() - began)


def _figures(
    args: argparse.Namespace, own: float, caller: float, parallel: float, batched: float
) -> runner.Figures:
    return {
        "own tx chains/s": own,
        "caller tx chains/s": caller,
        f"own tx, {args.tasks} tasks chains/s": parallel,
        "100/tx chains/s": batched,
    }


def _variant(state_kind: str, notify_kind: str, args: argparse.Namespace) -> runner.Variant:
    async def one_round() -> runner.Figures:
        async with stacks.open_stack(state_kind, notify_kind, args) as stack:
            client = stack.client

            async def own(index: int) -> None:
                await client.start_chain("bench-start", {"n": index})

            async def caller(index: int) -> None:
                async with AsyncSession(stack.engine) as session, session.begin():
                    await client.start_chain("bench-start", {"n": index}, session=session)

            batch = [ChainSpec("bench-start", {"n": index}) for index in range(_BATCH)]

            async def batched(_: int) -> None:
                await client.start_chains(batch)

            return _figures(
                args,
                await _rate(args.chains, own),
                await _rate(args.chains, caller),
                await _rate(args.chains, own, args.tasks),
                await _rate(args.batches, batched) * _BATCH,
            )

    return runner.Variant(stacks.label(state_kind, notify_kind), one_round)


_FLOOR = "Postgres, bare psycopg (floor)"


def _floor_variant(args: argparse.Namespace) -> runner.Variant:
    """The same shapes of work through psycopg alone, on a two-index table of its own."""
    import psycopg

    conninfo = make_url(args.postgres_url).set(drivername="postgresql").render_as_string(False)

    async def one_round() -> runner.Figures:
        table = f"{services.unique_prefix()}_floor"
        insert = (
            f"INSERT INTO {table} (id, type_name, input, created_at) VALUES (%s, %s, %s, now())"
        )
        connections = [
            await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            for _ in range(args.tasks)
        ]
        try:
            await connections[0].execute(
                f"CREATE TABLE {table} (id text PRIMARY KEY, type_name text NOT NULL, "
                "input jsonb, created_at timestamptz NOT NULL)"
            )
            await connections[0].execute(f"CREATE INDEX ON {table} (type_name, created_at)")
            ids = itertools.count()

            def row(index: int) -> tuple[str, str, str]:
                return (f"r{next(ids)}", "bench-start", json.dumps({"n": index}))

            async def one(index: int, conn: psycopg.AsyncConnection[object]) -> None:
                await conn.execute(insert, row(index))

            async def in_transaction(index: int) -> None:
                conn = connections[0]
                async with conn.transaction():
                    await conn.execute(insert, row(index))

            async def hundred(_: int) -> None:
                conn = connections[0]
                async with conn.transaction(), conn.cursor() as cursor:
                    await cursor.executemany(insert, [row(index) for index in range(_BATCH)])

            single = await _rate(args.chains, lambda index: one(index, connections[0]))
            explicit = await _rate(args.chains, in_transaction)
            parallel = await _rate(
                args.chains, lambda index: one(index, connections[index % args.tasks]), args.tasks
            )
            batched = await _rate(args.batches, hundred) * _BATCH
            await connections[0].execute(f"DROP TABLE {table}")
        finally:
            for conn in connections:
                await conn.close()
        return _figures(args, single, explicit, parallel, batched)

    return runner.Variant(_FLOOR, one_round)


async def run(args: argparse.Namespace) -> str:
    combos = stacks.combinations(args)
    variants = [_variant(state, notify, args) for state, notify in combos]
    if args.floor and any(state == "postgres" for state, _ in combos):
        variants.append(_floor_variant(args))
    rows = await runner.medians(variants, args.rounds)
    notes = [await stacks.server_notes(args), runner.machine_notes()]
    if _FLOOR in rows:
        notes.insert(
            0,
            "the floor row runs one-row INSERTs (autocommit; between BEGIN and COMMIT in the "
            "caller tx column) and 100-row executemany transactions into a plain table with "
            "a primary key and one index: no queue code",
        )
    return runner.report(
        "Start throughput",
        [
            f"Medians of {args.rounds} alternating rounds; {args.chains:,} chains one per "
            f"transaction (one task, then {args.tasks} tasks), {args.batches} transactions of "
            f"{_BATCH}:",
            runner.table(rows, first_column="state + notify"),
        ],
        notes=notes,
    )
