"""State-adapter conformance: retention (``prune_chains``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.testing.state_cases.support import claim_one, complete, start, total_jobs
from state_adapters.errors import ChainNotFoundError, InvalidInputError
from state_adapters.notifications import NotificationBuffer


def _soon() -> datetime:
    """A cut-off after everything finished so far."""
    return datetime.now(UTC) + timedelta(seconds=1)


async def _finished_chains(state: Any, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        chain = await start(state)
        await complete(state, await claim_one(state))
        ids.append(chain.id)
    return ids


async def _prune_all(state: Any, before: datetime, batch_size: int = 500) -> int:
    total = 0
    while True:
        deleted = int(await state.prune_chains(before, batch_size=batch_size))
        total += deleted
        if deleted < batch_size:
            return total


class PruningCases:
    """Retention: cases every state adapter must pass."""

    async def test_prune_deletes_finished_chains_with_their_jobs_and_keeps_unfinished_ones(
        self, state: Any
    ) -> None:
        (done,) = await _finished_chains(state, 1)
        cancelled = await start(state, "c")
        await state.cancel_chain(cancelled.id, notes=NotificationBuffer())
        waiting = await start(state)
        assert await state.prune_chains(_soon()) == 2
        for chain_id in (done, cancelled.id):
            with pytest.raises(ChainNotFoundError):
                await state.get_chain(chain_id)
        assert (await state.get_chain(waiting.id)).status == "pending"
        assert await total_jobs(state) == 1

    async def test_prune_keeps_chains_that_finished_after_the_cutoff(self, state: Any) -> None:
        before = datetime.now(UTC) - timedelta(seconds=1)
        (done,) = await _finished_chains(state, 1)
        assert await state.prune_chains(before) == 0
        assert (await state.get_chain(done)).status == "completed"

    async def test_prune_deletes_at_most_batch_size_chains_per_call(self, state: Any) -> None:
        await _finished_chains(state, 5)
        cutoff = _soon()
        assert [await state.prune_chains(cutoff, batch_size=2) for _ in range(4)] == [2, 2, 1, 0]
        assert await total_jobs(state) == 0

    async def test_prune_never_deletes_a_chain_an_unfinished_chain_waits_on(
        self, state: Any
    ) -> None:
        blocker = await start(state, "first")
        dependent = await start(state, "second", blockers=[blocker.id])
        await complete(state, await claim_one(state, ["first"]))
        assert await _prune_all(state, _soon()) == 0
        assert (await state.get_chain(blocker.id)).status == "completed"
        await complete(state, await claim_one(state, ["second"]))
        assert await _prune_all(state, _soon()) == 2
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(dependent.id)

    async def test_a_pruned_chains_dedup_key_is_released(self, state: Any) -> None:
        first = await start(state, dedup_key="k", dedup_scope="ever")
        await complete(state, await claim_one(state))
        assert await state.prune_chains(_soon()) == 1
        again = await start(state, dedup_key="k", dedup_scope="ever")
        assert again.id != first.id and again.deduplicated is False

    async def test_concurrent_prunes_delete_each_chain_once(self, state: Any) -> None:
        await _finished_chains(state, 24)
        cutoff = _soon()
        counts = await asyncio.gather(*(_prune_all(state, cutoff, batch_size=5) for _ in range(4)))
        assert sum(counts) == 24
        assert await total_jobs(state) == 0

    async def test_prune_refuses_a_naive_cutoff_or_a_bad_batch_size(self, state: Any) -> None:
        with pytest.raises(InvalidInputError):
            await state.prune_chains(datetime.now())
        with pytest.raises(InvalidInputError):
            await state.prune_chains(_soon(), batch_size=0)
