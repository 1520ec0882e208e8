"""``queuert-notify worker --processes N``: a supervisor keeps N worker processes
running, restarts a crashed one, and drains them all on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.worker.supervisor import (
    EXIT_CHILDREN_FAILING,
    EXIT_JOBS_ABANDONED,
    Supervisor,
)
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
    # ~8 s on a quiet machine, all but ~1 s of it three processes starting, a fourth
    # replacing the killed one and its jobs' 2 s leases running out: fewer jobs would
    # only let the kill land after the run.
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


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
async def test_worker_processes_of_a_sigkilled_supervisor_drain_their_jobs_and_exit(
    client: Client, workers: WorkerProcesses, effects: Any, engine: AsyncEngine
) -> None:
    supervisor = workers.start_supervisor("supervisor", 2, QT_CONCURRENCY="4", QT_POLL="0.5")
    await wait_until(lambda: _alive_children(supervisor, 2), timeout=30, interval=0.1)
    children = _children(supervisor)
    chains = await client.start_chains([ChainSpec("effect", {"sleep": 3}) for _ in range(8)])

    async def all_running() -> bool:
        return (await client.count_jobs()).get("running", 0) == 8

    await wait_until(all_running, timeout=30, interval=0.05)
    supervisor.kill()
    supervisor.wait(10)

    async def all_exited() -> bool:
        return not [pid for pid in children if _alive(pid)]

    await wait_until(all_exited, timeout=60, interval=0.1)
    log = workers.log("supervisor")
    # The parent-death signal may come more than once (once per thread of the dead
    # supervisor): it is one cause, one drain, never a cancel.
    assert "the job runs again once its lease expires" not in log, log
    assert log.count("the supervisor is gone; draining running jobs") == 2, log
    done = [await client.get_chain(chain.id) for chain in chains]
    assert [(chain.status, chain.last_job.attempt) for chain in done] == [("completed", 1)] * 8
    assert await effect_counts(engine, effects) == (8, 8)


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
async def test_a_second_sigterm_that_abandons_running_jobs_makes_the_supervisor_exit_non_zero(
    client: Client, workers: WorkerProcesses, effects: Any
) -> None:
    supervisor = workers.start_supervisor(
        "supervisor", 2, verbose=True, QT_CONCURRENCY="4", QT_POLL="0.5"
    )
    await wait_until(lambda: _alive_children(supervisor, 2), timeout=30, interval=0.1)
    await client.start_chains([ChainSpec("effect", {"sleep": 600}) for _ in range(8)])

    async def all_running() -> bool:
        return (await client.count_jobs()).get("running", 0) == 8

    await wait_until(all_running, timeout=30, interval=0.05)
    supervisor.send_signal(signal.SIGTERM)

    async def both_draining() -> bool:
        return workers.log("supervisor").count("stopping: draining 4 running jobs") == 2

    await wait_until(both_draining, timeout=30, interval=0.05)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == EXIT_JOBS_ABANDONED, workers.log("supervisor")
    assert (await client.count_jobs()).get("running", 0) == 8  # retried once leases expire


@pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
@pytest.mark.parametrize("notify_kind", ["redis"], indirect=True)
@pytest.mark.parametrize("worker_app", ["tests.support.e2e_app:crash_at_start"])
async def test_sigterm_during_a_crash_loop_makes_the_supervisor_exit_non_zero(
    workers: WorkerProcesses,
) -> None:
    supervisor = workers.start_supervisor("supervisor", 2)

    async def crash_looping() -> bool:
        # Three crashes of two processes: one of them crashed twice in a row.
        return workers.log("supervisor").count("exited with code 7; restarting it") >= 3

    await wait_until(crash_looping, timeout=60, interval=0.05)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == EXIT_CHILDREN_FAILING, workers.log("supervisor")


# A child that exits 7 the first time it is started and after that runs until a signal.
_CHILD = """
import os, sys, time
if not os.path.exists(sys.argv[1]):
    open(sys.argv[1], "w").close()
    sys.exit(7)
time.sleep(3600)
"""


async def test_a_stop_while_a_crashed_child_is_being_restarted_reaches_the_new_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "child"
    supervisor = Supervisor([sys.executable, "-c", _CHILD, str(marker)], 1, restart_first=0.01)
    spawn: Callable[..., Awaitable[asyncio.subprocess.Process]] = asyncio.create_subprocess_exec
    started: list[asyncio.subprocess.Process] = []

    async def spawn_then_stop(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        child = await spawn(*args, **kwargs)
        started.append(child)
        if len(started) == 2:
            # SIGTERM handled after the restart's fork, before the supervisor has seen
            # what the fork returned.
            supervisor.stop()
        return child

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_then_stop)
    try:
        code = await asyncio.wait_for(supervisor.run(), 30)
    finally:
        for child in started:
            if child.returncode is None:
                child.kill()
                await child.wait()
    assert [child.returncode for child in started] == [7, -signal.SIGTERM]
    assert code == 0
