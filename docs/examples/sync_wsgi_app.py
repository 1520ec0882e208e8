"""A synchronous WSGI app that enqueues in its own transaction, and a worker that runs
the jobs. No server needed: SQLite in a temporary directory, workers poll.

    python docs/examples/sync_wsgi_app.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from sqlalchemy import String, create_engine, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from queuert_notify import Client, NoopNotifyAdapter, SyncClient
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    charged: Mapped[bool] = mapped_column(default=False)


def make_app(engine: Any, jobs: SyncClient) -> Any:
    """POST /orders {"item": ...}: the order and its charge job commit together."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = json.loads(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"])))
        with Session(engine) as session, session.begin():
            order = Order(item=body["item"])
            session.add(order)
            session.flush()  # the order's id, for the job's input
            order_id = order.id
            chain = jobs.start_chain("charge-order", {"order_id": order_id}, session=session)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"order": order_id, "job": chain.id}).encode()]

    return app


async def charge_order(job: Any, ctx: Any) -> dict[str, int]:
    # Legacy sync code runs on the completion's transaction through run_sync.
    def mark_charged(session: Session) -> None:
        session.get_one(Order, job.input["order_id"]).charged = True

    await ctx.session.run_sync(mark_charged)
    return {"charged": job.input["order_id"]}


async def run_worker(database_url: str) -> int:
    engine = create_async_engine(database_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix="queuert_")
    async with Client(state=state, notify=NoopNotifyAdapter()) as client:
        ran = await run_until_idle(client, {"charge-order": charge_order})
    await engine.dispose()
    return ran


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    path = Path(tempfile.mkdtemp()) / "shop.db"
    engine = create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    with SyncClient(engine, table_prefix="queuert_") as jobs:
        jobs.migrate()
        server = make_server("127.0.0.1", 0, make_app(engine, jobs), handler_class=QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        for item in ("book", "lamp"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{server.server_port}/orders",
                data=json.dumps({"item": item}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request) as response:
                print(response.status, json.loads(response.read())["order"])
        server.shutdown()
    print("jobs run:", asyncio.run(run_worker(f"sqlite+aiosqlite:///{path}")))
    with Session(engine) as session:
        charged = session.scalars(select(Order.item).where(Order.charged)).all()
    print("charged:", sorted(charged))
    engine.dispose()


if __name__ == "__main__":
    main()
