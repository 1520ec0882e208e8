"""A worker's stop, from the request to the last task it gives up on."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

CANCEL_GRACE = 1.0
"""Seconds cancelled tasks get to end when the worker stops without waiting any longer
(``drain_timeout`` passed, a second signal): a task blocked on a database that does not
answer may not end sooner, and the worker stops without it."""


class Shutdown:
    """The stop of one worker, in three steps:

    1. :meth:`request` (``stop()``, a signal): the loop claims nothing more;
    2. :meth:`drain`: the loop and the running jobs get ``drain_timeout`` seconds to end
       (none when the stop is forced: ``stop(force=True)`` or a second signal);
    3. :meth:`give_up`: whatever is left is cancelled by the worker and gets
       :data:`CANCEL_GRACE` seconds, the deadline every later wait keeps.
    """

    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.requested = False
        self.forced = False
        self.give_up_at: float | None = None
        """``loop.time()`` by which the worker stops without what has not ended."""
        self._requested = asyncio.Event()
        self._forced = asyncio.Event()

    def request(self, *, force: bool) -> None:
        self.requested = True
        self._requested.set()
        if force:
            self.forced = True
            self._forced.set()

    async def until_requested(self, task: asyncio.Task[None]) -> None:
        """Wait for a stop request, or for ``task`` (the loop) to end first."""
        requested = asyncio.create_task(self._requested.wait())
        try:
            await asyncio.wait({task, requested}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            requested.cancel()

    async def drain(
        self, going: Callable[[], Iterable[asyncio.Task[None]]]
    ) -> set[asyncio.Task[None]]:
        """Wait for the tasks ``going()`` names until ``drain_timeout`` has passed or the
        stop is forced; return those still going."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        forced = asyncio.create_task(self._forced.wait())
        try:
            while True:
                left = {task for task in going() if not task.done()}
                remaining = deadline - loop.time()
                if not left or self.forced or remaining <= 0:
                    return left
                await asyncio.wait(
                    {*left, forced}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            forced.cancel()

    def give_up(self) -> float:
        """The worker cancels what is left: from now on every wait ends by the returned
        ``loop.time()``."""
        if self.give_up_at is None:
            self.give_up_at = asyncio.get_running_loop().time() + CANCEL_GRACE
        return self.give_up_at


async def settle(tasks: Iterable[asyncio.Future[Any]], until: float) -> None:
    """Wait until ``loop.time()`` reaches ``until`` for ``tasks`` (cancelled or ending)
    to end; log the ones that do not (they wait on a connection that does not answer)."""
    tasks = set(tasks)
    if not tasks:
        return
    grace = max(until - asyncio.get_running_loop().time(), 0.0)
    done, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        logger.warning("a cancelled task did not end in time; stopping without it: %r", task)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("stopping: %r failed", task, exc_info=task.exception())


@contextmanager
def stop_signals(on_signal: Callable[[int], None], *, enabled: bool = True) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT call ``on_signal(signum)`` on the running
    loop instead of ending the process; the previous handling comes back after it. Only
    in the main thread, and where the loop supports it (not on Windows loops)."""
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    if enabled and threading.current_thread() is threading.main_thread():
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(stop_signal, on_signal, stop_signal)
            except (NotImplementedError, RuntimeError):
                continue
            installed.append(stop_signal)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def stopping_line(running: int, drain_timeout: float, *, force: bool) -> str:
    """What a stop signal is answered with, at the default level: what happens now."""
    if force:
        return f"stopping now: cancelling {running} running jobs (they run again later)"
    return (
        f"stopping: draining {running} running jobs (up to {drain_timeout:g} s; "
        "press Ctrl-C again to stop now)"
    )
