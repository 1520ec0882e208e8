"""State-adapter conformance: listing."""

from __future__ import annotations

from typing import Any

from queuert_notify.testing.state_cases.support import (
    claim_one,
    complete,
    start,
    token,
)
from state_adapters.model import Completion, ContinueWith, NewJob
from state_adapters.notifications import NotificationBuffer


class ListingCases:
    """Listing: cases every state adapter must pass."""

    async def test_list_chains_pages_through_every_chain_newest_first(self, state: Any) -> None:
        ids = [(await start(state, "a" if n % 3 else "b")).id for n in range(7)]
        seen: list[str] = []
        cursor = None
        while True:
            page = await state.list_chains(limit=3, after=cursor)
            seen.extend(chain.id for chain in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == ids[::-1]
        only_b = await state.list_chains(type_name="b")
        assert [c.id for c in only_b.items] == [ids[6], ids[3], ids[0]]
        await complete(state, await claim_one(state, ["a"]))
        done = await state.list_chains(status="completed")
        assert [c.id for c in done.items] == [ids[1]] and done.next_cursor is None

    async def test_list_jobs_pages_newest_first_or_in_chain_order(self, state: Any) -> None:
        ids = [(await start(state)).id for _ in range(5)]
        first = await state.list_jobs(limit=2)
        second = await state.list_jobs(limit=10, after=first.next_cursor)
        assert [j.id for j in [*first.items, *second.items]] == ids[::-1]
        assert second.next_cursor is None
        job = await claim_one(state)
        for step in range(3):
            follow = ContinueWith(NewJob("next", {"step": step}))
            await state.complete_jobs(
                [Completion(job.id, token(job), continue_with=follow)],
                notes=NotificationBuffer(),
            )
            job = await claim_one(state, ["next"])
            assert job.chain_id == ids[0]
        chain_page = await state.list_jobs(chain_id=ids[0], limit=2)
        rest = await state.list_jobs(chain_id=ids[0], limit=2, after=chain_page.next_cursor)
        indexes = [j.chain_index for j in [*chain_page.items, *rest.items]]
        assert indexes == [0, 1, 2, 3] and rest.next_cursor is None
        running = await state.list_jobs(status="running")
        assert [j.id for j in running.items] == [job.id]

    async def test_count_jobs_counts_per_status(self, state: Any) -> None:
        for _ in range(3):
            await start(state, "a")
        await start(state, "b")
        await complete(state, await claim_one(state, ["a"]))
        await claim_one(state, ["a"])
        counts = await state.count_jobs()
        assert {k: v for k, v in counts.items() if v} == {
            "pending": 2,
            "running": 1,
            "completed": 1,
        }
        assert (await state.count_jobs(type_names=["b"]))["pending"] == 1

    async def test_count_active_jobs_counts_pending_and_running_per_type(self, state: Any) -> None:
        for _ in range(3):
            await start(state, "a")
        await start(state, "b")
        await complete(state, await claim_one(state, ["a"]))
        await claim_one(state, ["a"])
        counts = await state.count_active_jobs(["a", "b", "c"])
        assert {name: dict(by_status) for name, by_status in counts.items()} == {
            "a": {"pending": 1, "running": 1},
            "b": {"pending": 1, "running": 0},
            "c": {"pending": 0, "running": 0},
        }
