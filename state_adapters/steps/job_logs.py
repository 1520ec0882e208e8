"""The lines jobs log: written in batches (with a completion, or on their own while
the job runs or after it failed), read in order from a position."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import Insert, Integer, Select, and_, bindparam, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from state_adapters.arguments import check_key
from state_adapters.errors import InvalidInputError
from state_adapters.model import JobLogLine, LogPosition
from state_adapters.schema import Tables

if TYPE_CHECKING:
    from state_adapters.database import Conn, Database
    from state_adapters.transactions.calls import CallerSession, Transactions
    from state_adapters.transactions.connection_lanes import ConnectionLanes

_READ_LIMIT = 10_000
"""Lines returned by one read at most; the next read continues after the last."""


@cache
def insert_lines(tables: Tables) -> Insert:
    """The insert of one line, built once per table set (so it is compiled once); run
    with a list of :func:`line_row` to write a batch."""
    return insert(tables.job_logs)


def line_row(line: JobLogLine) -> dict[str, Any]:
    return {
        "job_id": line.job_id,
        "attempt": line.attempt,
        "seq": line.seq,
        "at": line.at,
        "level": line.level,
        "message": line.message,
        "fields": dict(line.fields) if line.fields else None,
    }


async def write_lines(conn: Conn, tables: Tables, lines: Sequence[JobLogLine]) -> None:
    """Write ``lines`` in the caller's transaction: one statement, whatever their number."""
    if lines:
        await conn.execute(insert_lines(tables), [line_row(line) for line in lines])


@cache
def read_lines(tables: Tables) -> Select[Any]:
    """A job's lines after the position (``:attempt``, ``:seq``), in order."""
    t = tables.job_logs
    attempt = bindparam("attempt", type_=Integer())
    return (
        select(t.c.job_id, t.c.attempt, t.c.seq, t.c.at, t.c.level, t.c.message, t.c.fields)
        .where(
            t.c.job_id == bindparam("job_id"),
            or_(t.c.attempt > attempt, and_(t.c.attempt == attempt, t.c.seq > bindparam("seq"))),
        )
        .order_by(t.c.attempt, t.c.seq)
        .limit(_READ_LIMIT)
    )


class JobLogMethods:
    """Job log lines of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    _db: Database
    _transactions: Transactions
    _lanes: ConnectionLanes
    tables: Tables

    async def append_job_logs(self, lines: Sequence[JobLogLine]) -> None:
        """Write ``lines`` (of any jobs) in one transaction of their own, so they are kept
        whatever becomes of the job's own transaction."""
        if not lines:
            return
        tables = self.tables

        async def step(conn: Conn) -> None:
            await write_lines(conn, tables, lines)

        async with self._lanes.connection() as lane:
            await self._db.in_transaction(lane, step)

    async def job_logs(
        self,
        job_id: str,
        *,
        after: LogPosition | None = None,
        session: CallerSession = None,
    ) -> list[JobLogLine]:
        """The lines job ``job_id`` logged, by attempt then ``seq``; with ``after=(attempt,
        seq)`` (the last line already read) only the later ones. At most 10,000 lines a
        read: read again after the last for more. No lines (not an error) for an unknown
        job."""
        check_key(job_id, "job_id")
        attempt, seq = _position(after)
        async with self._transactions.read(session) as conn:
            rows = await _rows(conn, self.tables, job_id, attempt, seq)
        return [
            JobLogLine(r.job_id, r.attempt, r.seq, r.at, r.level, r.message, r.fields) for r in rows
        ]


async def _rows(
    conn: AsyncConnection, tables: Tables, job_id: str, attempt: int, seq: int
) -> Sequence[Any]:
    params = {"job_id": job_id, "attempt": attempt, "seq": seq}
    rows: Sequence[Any] = (await conn.execute(read_lines(tables), params)).all()
    return rows


def _position(after: LogPosition | None) -> LogPosition:
    if after is None:
        return 0, 0
    if (
        not isinstance(after, tuple)
        or len(after) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in after)
    ):
        raise InvalidInputError(
            f"after must be (attempt, seq) of the last line read, as ints; got {after!r}"
        )
    return after
