"""``queuert-notify worker --processes N``: a supervisor keeps N worker processes
running, restarts a crashed one, and drains them all on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from tests.support.queue_helpers import wait_until
from tests.support.worker_processes import WorkerProcesses, effect_counts

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.worker_process_fixtures"]


def _children(supervisor: subprocess.Popen[bytes]) -> set[int]:
    path = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children")
    try:
        return {int(pid) for pid in path.read_text().split()}
    except FileNotFoundError:
        return set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers: it is dead once its state says so.
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
async def test_a_sigkilled_worker_process_is_restarted_and_every_job_completes_once(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    total = 200
    supervisor = workers.start_supervisor(
        "supervisor", 2, QT_CONCURRENCY="4", QT_LEASE="2", QT_POLL="0.5", QT_REAP="0.5"
    )
    await wait_until(lambda: _alive_children(supervisor, 2), timeout=30, interval=0.1)
    first_children = _children(supervisor)
    await client.start_chains([ChainSpec("effect", {"sleep": 0.05}) for _ in range(total)])

    async def some_done() -> bool:
        return (await effect_counts(engine, effects))[0] >= 20

    await wait_until(some_done, timeout=30, interval=0.05)
    victim = min(first_children)
    os.kill(victim, signal.SIGKILL)

    async def replaced() -> bool:
        children = _children(supervisor)
        return len(children) == 2 and victim not in children

    await wait_until(replaced, timeout=30, interval=0.1)

    async def all_completed() -> bool:
        return (await client.count_jobs()).get("completed", 0) == total

    await wait_until(all_completed, timeout=90, interval=0.2)
    assert await effect_counts(engine, effects) == (total, total)
    counts = await client.count_jobs()
    assert {status: n for status, n in counts.items() if n} == {"completed": total}
    log = workers.log("supervisor")
    assert "exited with signal SIGKILL; restarting it in" in log, log

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, workers.log("supervisor")


async def _alive_children(supervisor: subprocess.Popen[bytes], count: int) -> bool:
    return len(_children(supervisor)) == count


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
async def test_sigterm_to_the_supervisor_drains_every_worker_process_and_exits_0(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    supervisor = workers.start_supervisor("supervisor", 2, QT_CONCURRENCY="4", QT_POLL="0.5")
    await wait_until(lambda: _alive_children(supervisor, 2), timeout=30, interval=0.1)
    children = _children(supervisor)
    # Eight jobs of two seconds: both processes hold four when the signal comes.
    chains = await client.start_chains([ChainSpec("effect", {"sleep": 2}) for _ in range(8)])

    async def all_running() -> bool:
        return (await client.count_jobs()).get("running", 0) == 8

    await wait_until(all_running, timeout=30, interval=0.05)
    supervisor.send_signal(signal.SIGTERM)

    assert supervisor.wait(30) == 0, workers.log("supervisor")
    assert not [pid for pid in children if _alive(pid)]
    done = [await client.get_chain(chain.id) for chain in chains]
    assert [(chain.status, chain.last_job.attempt) for chain in done] == [("completed", 1)] * 8
    assert await effect_counts(engine, effects) == (8, 8)
