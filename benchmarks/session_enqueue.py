"""Issue #27: what ``start_chain(..., session=s)`` costs the application's own
transaction, next to a bare INSERT of one row in the same transaction.

Every transaction (an ``AsyncSession`` of the queue's engine, or an ``AsyncConnection``
for the ``connection`` rows) is opened by an untimed ``SELECT 1`` -- so no measure
carries the BEGIN -- and then does three things, timed separately, in an order that
rotates from one transaction to the next:

- ``start_chain``: ``client.start_chain(type, input, session=s)``;
- ``session INSERT``: ``s.execute(insert(table).values(...))``, a one-row Core INSERT
  through the same session (what the application's own row costs);
- ``driver INSERT`` (the floor): the same one-row INSERT sent by the driver itself
  (psycopg's ``execute``, asyncpg's ``execute``) on the connection under the session;
- ``queue statement``: the statement ``start_chain`` sends (a chain and its first job),
  its arguments made beforehand, sent by the driver itself: what the database takes
  for the queue's rows, so that ``start_chain`` minus it is the queue's own code.

The INSERTs go into a table of the run's own with a primary key and one index (the
shape of the peers benchmark's floor). The queue's notify adapter is in-process: the
wakeup is scheduled after COMMIT, outside every measure. Ratios are medians over rounds
of each round's median per transaction.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Column, DateTime, Index, MetaData, String, Table, func, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from benchmarks import runner, services, stacks

NAME = "session-enqueue"
HELP = "start_chain(session=) in the application's transaction next to a bare INSERT"

_DRIVERS = ("psycopg", "asyncpg")
_FORMS = ("session", "connection")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds")
    parser.add_argument("--transactions", type=int, default=1000, help="per round and variant")
    parser.add_argument(
        "--drivers", default=",".join(_DRIVERS), help=f"comma-separated: {', '.join(_DRIVERS)}"
    )
    parser.add_argument(
        "--forms",
        default=",".join(_FORMS),
        help="comma-separated: session (AsyncSession), connection (AsyncConnection)",
    )
    parser.add_argument("--postgres-url", default=services.postgres_url())
    parser.add_argument("--redis-url", default=services.redis_url())
    parser.add_argument("--nats-url", default=services.nats_url())


def _floor_sql(driver: str, table: str) -> str:
    mark = ("%s", "%s") if driver == "psycopg" else ("$1", "$2")
    return f"INSERT INTO {table} (id, type_name, created_at) VALUES ({mark[0]}, {mark[1]}, now())"


async def _send(driver: str, connection: AsyncConnection, sql: str, row: Sequence[Any]) -> None:
    """``sql`` through the driver connection under ``connection``, in its transaction
    (begun by the untimed ``SELECT 1``)."""
    raw = (await connection.get_raw_connection()).driver_connection
    assert raw is not None
    if driver == "psycopg":
        await raw.execute(sql, row)
    else:
        await raw.execute(sql, *row)


def _queue_statement(state: Any) -> tuple[str, Callable[[], Sequence[Any]]]:
    """The SQL of a plain one-chain start and a maker of its driver arguments (a new
    chain id each), from the state layer's own definitions."""
    from state_adapters.ids import new_id
    from state_adapters.model import NewJob
    from state_adapters.statements.records import FirstJob

    database = state._db

    def query() -> Any:
        first = FirstJob(NewJob("bench-start", {"n": 1}), new_id(), None, 0)
        return database._own.insert_first_jobs([first], datetime.now(UTC))

    def arguments() -> Sequence[Any]:
        made = query()
        return cast(Sequence[Any], database.compiled(made.statement).arguments(made.params))

    return database.compiled(query().statement).sql, arguments


def _variant(driver: str, form: str, args: argparse.Namespace) -> runner.Variant:
    label = f"{driver}, {'AsyncSession' if form == 'session' else 'AsyncConnection'}"

    async def one_round() -> runner.Figures:
        url = make_url(args.postgres_url).set(drivername=f"postgresql+{driver}")
        args_for_stack = argparse.Namespace(
            postgres_url=url.render_as_string(hide_password=False),
            redis_url=args.redis_url,
            nats_url=args.nats_url,
        )
        async with stacks.open_stack("postgres", "in-process", args_for_stack) as stack:
            engine, client = stack.engine, stack.client
            metadata = MetaData()
            table = Table(
                f"{services.unique_prefix()}_rows",
                metadata,
                Column("id", String, primary_key=True),
                Column("type_name", String, nullable=False),
                Column("created_at", DateTime(timezone=True), nullable=False),
            )
            Index(None, table.c.type_name, table.c.created_at)
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
            floor_sql = _floor_sql(driver, table.name)
            ids = itertools.count()
            queue_sql, queue_arguments = _queue_statement(stack.client.state)
            timings: dict[str, list[float]] = {
                "start_chain": [],
                "session": [],
                "driver": [],
                "queue": [],
            }

            async def measured(target: Any, connection: AsyncConnection, order: list[str]) -> None:
                queue_row = queue_arguments()
                steps: dict[str, Callable[[], Awaitable[object]]] = {
                    "start_chain": lambda: client.start_chain(
                        "bench-start", {"n": 1}, session=target
                    ),
                    "session": lambda: target.execute(
                        insert(table).values(
                            id=f"s{next(ids)}", type_name="bench", created_at=func.now()
                        )
                    ),
                    "driver": lambda: _send(driver, connection, floor_sql, (f"d{next(ids)}", "b")),
                    "queue": lambda: _send(driver, connection, queue_sql, queue_row),
                }
                for name in order:
                    began = time.perf_counter()
                    await steps[name]()
                    timings[name].append(time.perf_counter() - began)

            names = list(timings)
            for index in range(args.transactions):
                order = names[index % 4 :] + names[: index % 4]
                if form == "session":
                    async with AsyncSession(engine) as session, session.begin():
                        await session.execute(text("SELECT 1"))
                        await measured(session, await session.connection(), order)
                else:
                    async with engine.begin() as connection:
                        await connection.execute(text("SELECT 1"))
                        await measured(connection, connection, order)
            async with engine.begin() as conn:
                await conn.run_sync(metadata.drop_all)
        start, session, floor, queue = (statistics.median(timings[n]) * 1e6 for n in names)
        return {
            "start_chain µs": start,
            "session INSERT µs": session,
            "driver INSERT µs": floor,
            "queue statement µs": queue,
            "start_chain / session INSERT": start / session,
            "start_chain / driver INSERT": start / floor,
            "start_chain / queue statement": start / queue,
        }

    return runner.Variant(label, one_round)


async def run(args: argparse.Namespace) -> str:
    drivers = runner.choices(args.drivers, _DRIVERS, "--drivers")
    forms = runner.choices(args.forms, _FORMS, "--forms")
    variants = [_variant(driver, form, args) for driver in drivers for form in forms]
    rows = await runner.medians(variants, args.rounds)
    return runner.report(
        "Enqueue in the application's transaction",
        [
            f"Medians over {args.rounds} alternating rounds of {args.transactions:,} "
            "transactions, each opened by an untimed SELECT 1, then doing start_chain("
            "session=...), a one-row INSERT through the same session, the same INSERT "
            "through the driver and start_chain's own statement through the driver (order "
            "rotating), one task:",
            runner.table(rows, first_column="driver, form"),
        ],
        notes=[
            "the INSERTs go into a table with a primary key and one index; start_chain "
            "inserts a chain and its first job (two tables, the jobs table with its "
            "indexes) in one statement",
            f"Postgres {await services.postgres_server_version(args.postgres_url)} on the "
            "same host; asyncpg " + _version("asyncpg"),
            runner.machine_notes(),
        ],
    )


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)
