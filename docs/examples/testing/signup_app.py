"""The application under test: signing up a user sends a welcome mail in the background."""

from typing import Any

from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from queuert_notify import Client, Job, JobContext


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)


OUTBOX: list[str] = []  # stands in for a mailer


async def sign_up(engine: AsyncEngine, client: Client, email: str) -> str:
    """Create the user and start its welcome chain in one transaction."""
    async with AsyncSession(engine) as session, session.begin():
        session.add(User(email=email))
        chain = await client.start_chain("send-welcome", {"to": email}, session=session)
    return chain.id


async def send_welcome(job: Job, ctx: JobContext) -> Any:
    OUTBOX.append(job.input["to"])
    return ctx.continue_with("record-welcome", {"to": job.input["to"]})


async def record_welcome(job: Job, ctx: JobContext) -> Any:
    return {"welcomed": job.input["to"]}


HANDLERS = {"send-welcome": send_welcome, "record-welcome": record_welcome}
