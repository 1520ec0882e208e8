"""A worker's writes to the state adapter: claims, and the completions batched with or
between them."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from queuert_notify.worker.completion_batcher import CompletionBatcher, CompletionResult
from state_adapters.errors import JobOwnershipLostError
from state_adapters.model import Completion, JobRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.protocol import StateAdapter


class Claimer:
    """Claims jobs of ``type_names`` for one worker and owns the :attr:`batcher` that
    writes its completions.

    When the state adapter says a completion costs less written along with a claim
    (``completes_with_claims``: SQLite, one writer at a time), a claim takes the
    completions waiting in the batcher and writes them in its own transaction;
    otherwise the batcher writes them meanwhile, on its own.
    """

    def __init__(
        self,
        state: StateAdapter,
        type_names: Sequence[str],
        *,
        worker_id: str,
        lease: float,
        flush: Callable[[NotificationBuffer], Coroutine[Any, Any, None]],
        max_batch: int,
        max_delay: float,
    ) -> None:
        self._state = state
        self._type_names = type_names
        self._worker_id = worker_id
        self._lease = lease
        self.batcher = CompletionBatcher(
            self._write_completions, flush, max_batch=max_batch, max_delay=max_delay
        )

    async def claim(self, limit: int) -> list[JobRecord]:
        """Claim up to ``limit`` jobs, each under a new lease token."""
        taken = self.batcher.take() if self._state.completes_with_claims else []
        if not taken:
            return await self._state.acquire(
                self._type_names, worker_id=self._worker_id, lease_seconds=self._lease, limit=limit
            )
        return await self.batcher.write_with(
            taken, lambda completions, notes: self._complete_and_acquire(completions, notes, limit)
        )

    async def _write_completions(
        self, completions: list[Completion], notes: NotificationBuffer
    ) -> Sequence[CompletionResult]:
        """How the batcher writes completions alone: ``complete_and_acquire`` with no
        claim (it reads back no job rows)."""
        written, _ = await self._complete_and_acquire(completions, notes, 0)
        return list(written)

    async def _complete_and_acquire(
        self, completions: list[Completion], notes: NotificationBuffer, limit: int
    ) -> tuple[list[JobOwnershipLostError | None], list[JobRecord]]:
        return await self._state.complete_and_acquire(
            completions,
            notes=notes,
            type_names=self._type_names,
            worker_id=self._worker_id,
            lease_seconds=self._lease,
            limit=limit,
        )
