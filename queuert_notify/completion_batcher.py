"""Coalesces completions that finish close together into one ``complete_jobs`` call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from queuert_notify.errors import JobOwnershipLostError
from queuert_notify.hooks import NotificationBuffer
from state_adapters.protocol import Completion, JobRecord, StateAdapter

logger = logging.getLogger(__name__)

_QUIET_TURNS = 2

CompletionResult = JobRecord | JobOwnershipLostError


class CompletionBatcher:
    """Completes leased jobs in batches, each batch one transaction and one notify flush.

    Invariants: every submitted completion is written exactly once or its caller gets
    the error (a batch that fails fails all its callers, whose leases then expire and
    are retried); at most one batch is in flight, so completions that arrive while one
    is being written form the next batch (up to ``max_batch``); a batch's callers learn
    its outcome as soon as it committed, and its notifications are published while the
    next batch is written (one publish in flight); ``close()`` writes what is queued,
    publishes, then stops the owned task.

    A batch starts once the completions that were ready have queued (the event loop
    ran the tasks that could run) and, with ``max_delay``, after that many seconds:
    waiting adds latency to every job, and completions arriving during a write batch
    up by themselves.
    """

    def __init__(
        self,
        state: StateAdapter,
        flush: Callable[[NotificationBuffer], Coroutine[Any, Any, None]],
        *,
        max_batch: int = 100,
        max_delay: float = 0.0,
    ) -> None:
        self._state = state
        self._flush = flush
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._queue: list[tuple[Completion, asyncio.Future[CompletionResult]]] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._publishing: asyncio.Task[None] | None = None
        self._closed = False

    async def complete(self, completion: Completion) -> CompletionResult:
        """Write ``completion`` with the next batch; returns the completed job, or the
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

    async def _run(self) -> None:
        try:
            while True:
                await self._ready.wait()
                if not self._queue:
                    if self._closed:
                        return
                    self._ready.clear()
                    continue
                await self._gather()
                await self._write_batch()
        finally:
            if self._publishing is not None:
                await self._publishing

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

    async def _write_batch(self) -> None:
        batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
        notes = NotificationBuffer()
        try:
            results = await self._state.complete_jobs([c for c, _ in batch], notes=notes)
        except Exception as exc:
            logger.warning(
                "completing a batch of jobs failed; their leases will expire and they will "
                "be retried",
                exc_info=True,
                extra={"job_ids": [c.job_id for c, _ in batch]},
            )
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        # Committed: publish while the next batch is written, one publish at a time.
        if self._publishing is not None:
            await self._publishing
        self._publishing = asyncio.create_task(self._flush(notes), name="queuert-batch-publish")

    async def close(self) -> None:
        """Write every queued completion, then let the background task end."""
        self._closed = True
        if self._task is None:
            return
        self._ready.set()
        await self._task
        self._task = None
