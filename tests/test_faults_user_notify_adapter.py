"""A notify adapter of the user's own that hangs or fails costs a worker latency only:
every call the worker makes to it is bounded, the worker polls regardless, and
``stop()`` keeps its drain timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, NoopNotifyAdapter, Worker
from queuert_notify.notify.protocol import TypeNameCallback, Unsubscribe
from queuert_notify.worker.shutdown import CANCEL_GRACE
from state_adapters import SqlAlchemyStateAdapter

DRAIN = 2.0


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[SqlAlchemyStateAdapter]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    adapter = SqlAlchemyStateAdapter(engine)
    await adapter.migrate()
    yield adapter
    await engine.dispose()


async def _forever() -> Any:
    await asyncio.Event().wait()


class HangsAfterConnect(NoopNotifyAdapter):
    """Connects, then never answers a worker's call (a server gone silent)."""

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        return await _forever()  # type: ignore[no-any-return]

    async def consume_wake_hint(self, type_name: str) -> bool:
        return await _forever()  # type: ignore[no-any-return]

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None:
        await _forever()

    async def listen_job_ownership_lost(self, job_id: str, callback: Any) -> Unsubscribe:
        return await _forever()  # type: ignore[no-any-return]


class HangsInConnect(HangsAfterConnect):
    async def connect(self) -> None:
        await _forever()


class FailsToConnect(NoopNotifyAdapter):
    async def connect(self) -> None:
        raise RuntimeError("this adapter cannot connect")

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        raise RuntimeError("this adapter cannot listen")


async def _noop(job: Any, ctx: Any) -> None:
    return None


@pytest.mark.parametrize("adapter", [HangsAfterConnect, HangsInConnect, FailsToConnect])
async def test_a_user_notify_adapter_that_hangs_or_fails_costs_only_latency(
    state: SqlAlchemyStateAdapter, adapter: type[NoopNotifyAdapter]
) -> None:
    client = Client(state=state, notify=adapter())
    worker = Worker(client, {"t": _noop}, poll_interval=0.5, drain_timeout=DRAIN)
    run = asyncio.create_task(worker.run(handle_signals=False))
    try:
        chain = await client.start_chain("t", {})
        await asyncio.wait_for(client.await_chain(chain.id, timeout=60), 60)
        assert (await client.get_chain(chain.id)).status == "completed"
    finally:
        stopping = time.monotonic()
        await asyncio.wait_for(worker.stop(), 60)
        took = time.monotonic() - stopping
        await asyncio.wait_for(run, 5)
    # Nothing runs: stopping takes at most the drain timeout and the cancel grace
    # (twice that for a loaded machine).
    assert took < 2 * (DRAIN + CANCEL_GRACE), took
