"""``run_until_idle``: drain the queue from an application's own tests.

Runs a real :class:`Worker` on the given client (so handlers, sessions, retries
and continuations behave as in production) until the database holds no job of
the handled types that is pending and due, running or blocked.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime

from queuert_notify.client.client import Client
from queuert_notify.events import EventKind, WorkerEvent
from queuert_notify.jobs import Handler
from queuert_notify.worker.worker import Worker

_CHECK_INTERVAL = 0.02
"""Seconds between two looks at the database while jobs are still under way."""
_POLL_INTERVAL = 0.1
"""The worker's SQL poll: picks up work no notification announced (e.g. a job that
became due while the run was going on) within this time."""
_FINISHED: tuple[EventKind, ...] = ("completed", "retried", "failed")
_GONE: tuple[EventKind, ...] = (*_FINISHED, "ownership_lost", "abandoned")


# The signature is fixed by DESIGN.md ("Testing helpers for users").
async def run_until_idle(
    client: Client,
    handlers: Mapping[str, Handler],
    *,
    timeout: float = 10.0,  # noqa: ASYNC109
) -> int:
    """Run a worker with ``handlers`` until no job of their types is pending and due,
    running or blocked; return how many handler runs finished (a job retried once
    counts twice).

    "Due" is decided by the clock: a job scheduled in the future (``delay=``,
    ``run_at=``, the backoff of a failed attempt) does not keep the run going and
    does not run. A blocked job does, until its blockers finish. Failed attempts
    are recorded as in production (look at the chain's status); they do not raise.
    Raises :class:`TimeoutError` naming what is left when the queue is not idle
    after ``timeout`` seconds (a handler that never returns, or a job blocked on a
    chain none of ``handlers`` runs).
    """
    if not handlers:
        raise ValueError("run_until_idle needs at least one handler")
    events: Counter[EventKind] = Counter()

    def count(event: WorkerEvent) -> None:
        events[event.kind] += 1

    type_names = list(handlers)
    worker = Worker(client, handlers, poll_interval=_POLL_INTERVAL, on_event=count)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with worker:
        while True:
            seen = sum(events.values())
            left = await _work_left(client, type_names, events)
            # Idle only if nothing happened on the worker while we looked: a job that
            # finished between the two reads may have made new work.
            if not left and sum(events.values()) == seen:
                break
            if loop.time() >= deadline:
                await worker.stop(force=True)
                raise TimeoutError(
                    f"run_until_idle: the queue was not idle after {timeout}s "
                    f"({left or 'still changing'}; types {', '.join(type_names)})"
                )
            await asyncio.sleep(_CHECK_INTERVAL)
    return sum(events[kind] for kind in _FINISHED)


async def _work_left(client: Client, type_names: list[str], events: Counter[EventKind]) -> str:
    """What keeps the queue busy, as a phrase; empty when nothing does."""
    in_flight = events["started"] - sum(events[kind] for kind in _GONE)
    if in_flight > 0:
        return f"{in_flight} handler(s) running"
    # Due first, then counts: a due job claimed in between shows up as running.
    due = await client.state.next_due_at(type_names)
    counts = await client.state.count_jobs(type_names=type_names)
    busy = [f"{counts[s]} {s}" for s in ("running", "blocked") if counts[s]]
    if due is not None and due <= datetime.now(UTC):
        busy.append(f"a pending job due since {due.isoformat()}")
    return ", ".join(busy)
