"""Coalesces completions that finish close together into one write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from queuert_notify.errors import JobOwnershipLostError
from state_adapters.model import Completion
from state_adapters.notifications import NotificationBuffer

logger = logging.getLogger(__name__)

CompletionResult = JobOwnershipLostError | None
"""``None`` once the completion is written; the error for a stale lease token."""

BatchWriter = Callable[
    [list[Completion], NotificationBuffer], Awaitable[Sequence[CompletionResult]]
]
"""Writes completions in one transaction: a result per completion, in order."""

T = TypeVar("T")

_QUIET_TURNS = 2

_Pending = tuple[Completion, "asyncio.Future[CompletionResult]"]


class CompletionBatcher:
    """Completes leased jobs in batches, each batch one transaction and one notify flush.

    Invariants: every submitted completion is written exactly once or its caller gets
    the error (a batch that fails fails all its callers, whose leases then expire and
    are retried); a completion is written by the batcher's own task or, taken with
    :meth:`take`, by the caller of :meth:`write_with`, never by both; at most one batch
    of the batcher's own is in flight, so completions that arrive while one is being
    written form the next batch (up to ``max_batch``); a batch's callers learn its
    outcome as soon as it committed, and its notifications are published while the next
    batch is written, in order; ``close()`` writes what is queued, publishes, then stops
    the owned tasks.

    A batch starts once the completions that were ready have queued (the event loop
    ran the tasks that could run) and, with ``max_delay``, after that many seconds:
    waiting adds latency to every job, and completions arriving during a write batch
    up by themselves.
    """

    def __init__(
        self,
        write: BatchWriter,
        flush: Callable[[NotificationBuffer], Coroutine[Any, Any, None]],
        *,
        max_batch: int = 100,
        max_delay: float = 0.0,
    ) -> None:
        self._write = write
        self._flush = flush
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._queue: list[_Pending] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._publishing: asyncio.Task[None] | None = None
        self._closed = False

    async def complete(self, completion: Completion) -> CompletionResult:
        """Write ``completion`` with the next batch; returns ``None`` once written, or the
        ``JobOwnershipLostError`` for a stale lease token (nothing written for it)."""
        if self._closed:
            raise RuntimeError("the completion batcher is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="queuert-completion-batcher")
        future: asyncio.Future[CompletionResult] = asyncio.get_running_loop().create_future()
        self._queue.append((completion, future))
        self._ready.set()
        # A caller cancelled meanwhile cancels only its own future: its completion stays
        # in the batch and the write goes on for every job in it.
        return await future

    def take(self) -> list[_Pending]:
        """The queued completions (up to ``max_batch``), for :meth:`write_with`."""
        taken, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
        return taken

    async def write_with(
        self,
        taken: list[_Pending],
        write: Callable[
            [list[Completion], NotificationBuffer],
            Awaitable[tuple[Sequence[CompletionResult], T]],
        ],
    ) -> T:
        """Write completions from :meth:`take` with ``write``, which also does something
        else in the same transaction and returns it (a claim)."""
        notes = NotificationBuffer()
        try:
            results, other = await write([c for c, _ in taken], notes)
        except BaseException as exc:
            self._fail(taken, exc)
            raise
        self._settle(taken, results, notes)
        return other

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            if not self._queue:
                if self._closed:
                    return
                self._ready.clear()
                continue
            await self._gather()
            await self._write_batch(self.take())

    async def _gather(self) -> None:
        """Let completions finishing together join the batch: yield to the event loop
        until two turns in a row queued nothing (a finished handler needs a couple of
        turns to reach the queue), then wait ``max_delay`` if set."""
        quiet = 0
        while quiet < _QUIET_TURNS and len(self._queue) < self._max_batch and not self._closed:
            queued = len(self._queue)
            await asyncio.sleep(0)
            quiet = quiet + 1 if len(self._queue) == queued else 0
        if self._max_delay > 0 and len(self._queue) < self._max_batch and not self._closed:
            await asyncio.sleep(self._max_delay)

    async def _write_batch(self, batch: list[_Pending]) -> None:
        if not batch:  # taken meanwhile by write_with
            return
        notes = NotificationBuffer()
        try:
            results = await self._write([c for c, _ in batch], notes)
        except Exception as exc:
            self._fail(batch, exc)
            return
        self._settle(batch, results, notes)

    def _fail(self, batch: list[_Pending], exc: BaseException) -> None:
        logger.warning(
            "completing a batch of jobs failed; their leases will expire and they will be retried",
            exc_info=exc,
            extra={"job_ids": [c.job_id for c, _ in batch]},
        )
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    def _settle(
        self, batch: list[_Pending], results: Sequence[CompletionResult], notes: NotificationBuffer
    ) -> None:
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        # Committed: publish after the previous batch's notifications, without holding
        # up the next write.
        self._publishing = asyncio.create_task(
            self._publish_after(self._publishing, notes), name="queuert-batch-publish"
        )

    async def _publish_after(
        self, previous: asyncio.Task[None] | None, notes: NotificationBuffer
    ) -> None:
        if previous is not None:
            with suppress(Exception):
                await previous
        await self._flush(notes)

    def abort(self) -> None:
        """Stop at once: cancel the batch being written and what is queued (their
        callers get ``CancelledError``; nothing of a cancelled batch commits, so the jobs
        run again once their leases expire). ``close()`` then returns without writing."""
        self._closed = True
        for _, future in self._queue:
            future.cancel()
        self._queue.clear()
        for task in (self._task, self._publishing):
            if task is not None:
                task.cancel()

    async def close(self) -> None:
        """Write every queued completion, publish, then let the background tasks end."""
        self._closed = True
        if self._task is not None:
            self._ready.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._publishing is not None:
            await asyncio.gather(self._publishing, return_exceptions=True)
            self._publishing = None
