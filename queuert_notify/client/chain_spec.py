"""One chain to start, as ``Client.start_chains`` and ``SyncClient.start_chains`` take it,
checked and converted into the state seam's ``NewChain`` before anything is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS
from state_adapters.model import DedupScope, NewChain
from state_adapters.validation import new_chain, new_job


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """One chain to start with :meth:`Client.start_chains`; fields as in
    :meth:`Client.start_chain`."""

    type_name: str
    input: Any = None
    dedup_key: str | None = None
    dedup_scope: DedupScope = "incomplete"
    dedup_window: float | None = None
    run_at: datetime | None = None
    delay: float | None = None
    priority: int = 0
    blockers: Sequence[str] = ()
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS
    concurrency_key: str | None = None

    def to_new_chain(
        self, chain_id: str | None = None, *, trace_context: str | None = None
    ) -> NewChain:
        """Validate and convert, with ``chain_id`` as the chain's id (``None``: the state
        adapter makes one) and ``trace_context`` stored with its first job; raises
        ``InvalidInputError`` before anything is written."""
        job = new_job(
            self.type_name,
            self.input,
            run_at=self.run_at,
            delay=self.delay,
            priority=self.priority,
            max_attempts=self.max_attempts,
            trace_context=trace_context,
            concurrency_key=self.concurrency_key,
        )
        return new_chain(
            job,
            dedup_key=self.dedup_key,
            dedup_scope=self.dedup_scope,
            dedup_window=self.dedup_window,
            blockers=self.blockers,
            chain_id=chain_id,
        )
