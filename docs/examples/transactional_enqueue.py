"""Transactional enqueue: a job is created in the same commit as the application's rows.

Run it (SQLite file in a temporary directory, in-process notifications):

    python docs/examples/transactional_enqueue.py

or against Postgres:

    python docs/examples/transactional_enqueue.py postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from sqlalchemy import String, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from queuert_notify import InProcessNotifyAdapter
from queuert_notify.client import Client
from queuert_notify.worker import Worker
from state_adapters import SqlAlchemyStateAdapter


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "example_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


async def send_welcome(job, ctx):  # type: ignore[no-untyped-def]
    # Atomic mode: ctx.session commits together with this job's completion.
    user = await ctx.session.get(User, job.input["user_id"])
    user.welcomed = True
    return {"sent_to": user.email}


async def main(url: str) -> None:
    engine = create_async_engine(url)
    state = SqlAlchemyStateAdapter(engine, table_prefix="example_")
    await state.migrate()  # the queue's tables, with their own version table
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)  # the application's tables
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        # 1. The user and the job commit together; the wakeup goes out after COMMIT.
        async with sessions() as session, session.begin():
            user = User(email="ada@example.com")
            session.add(user)
            await session.flush()  # assigns user.id
            chain = await client.start_chain("send-welcome", {"user_id": user.id}, session=session)

        # 2. A rolled-back transaction leaves neither the user nor the job behind.
        try:
            async with sessions() as session, session.begin():
                session.add(User(email="bob@example.com"))
                await client.start_chain("send-welcome", {"user_id": -1}, session=session)
                raise RuntimeError("payment declined")
        except RuntimeError:
            pass

        async with Worker(client, {"send-welcome": send_welcome}, poll_interval=5.0):
            done = await client.await_chain(chain.id, timeout=10)

        async with sessions() as session:
            emails = (await session.scalars(select(User.email))).all()
            welcomed = await session.scalar(select(User.welcomed).where(User.id == user.id))
        counts = await client.count_jobs()

    print(f"chain {done.id}: {done.status}, output {done.output}")
    print(f"users: {list(emails)}, ada welcomed: {welcomed}")
    print(f"jobs per status: { {k: v for k, v in counts.items() if v} }")

    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.drop_all)
        await conn.run_sync(state.metadata.drop_all)
        await conn.exec_driver_sql(f"DROP TABLE {state.tables.version_table}")
    await engine.dispose()  # an undisposed aiosqlite engine keeps the process alive


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(main(f"sqlite+aiosqlite:///{Path(directory) / 'app.db'}"))
