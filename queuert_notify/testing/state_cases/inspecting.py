"""State-adapter conformance: the reads that show the queue (overview, chain search,
chain links)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.testing.state_cases.support import claim_one, complete, start, token
from state_adapters.errors import InvalidInputError
from state_adapters.model import Completion, ContinueWith, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer


class InspectingCases:
    """Inspecting: cases every state adapter must pass."""

    async def test_queue_overview_counts_unfinished_now_and_finished_since(
        self, state: Any
    ) -> None:
        before = datetime.now(UTC) - timedelta(seconds=1)
        for _ in range(3):
            await start(state, "a")
        await start(state, "b")
        await complete(state, await claim_one(state, ["a"]))
        failing = await claim_one(state, ["a"])
        await state.fail_job(
            failing.id, token(failing), "boom", notes=NotificationBuffer(), final=True
        )
        cancelled = await start(state, "c")
        await state.cancel_chain(cancelled.id, notes=NotificationBuffer())
        await claim_one(state, ["b"])

        overview = await state.queue_overview(since=before)
        assert overview.unfinished == {"a": {"pending": 1}, "b": {"running": 1}}
        assert overview.finished == {"a": {"completed": 1, "failed": 1}, "c": {"cancelled": 1}}
        assert overview.type_names == ["a", "b", "c"]
        assert not overview.truncated
        assert sum(m.completed for m in overview.minutes) == 1
        assert sum(m.failed for m in overview.minutes) == 1
        assert sum(m.cancelled for m in overview.minutes) == 1
        for minute in overview.minutes:
            assert minute.start.tzinfo is not None
            assert minute.start.second == 0 and minute.start >= before - timedelta(minutes=1)

        later = await state.queue_overview(since=datetime.now(UTC) + timedelta(seconds=5))
        assert later.finished == {} and later.minutes == []
        capped = await state.queue_overview(since=before, finished_limit=2)
        assert capped.truncated
        assert sum(sum(c.values()) for c in capped.finished.values()) == 2

    async def test_find_chains_filters_by_status_type_and_search_and_pages(
        self, state: Any
    ) -> None:
        a1 = await start(state, "a", dedup_key="order-1")
        b1 = await start(state, "b")
        a2 = await start(state, "a")
        a3 = await start(state, "a")
        # a1 continues: its second job's id finds it, its status is the second job's.
        first = await claim_one(state, ["a"])
        assert first.id == a1.id
        await state.complete_jobs(
            [Completion(first.id, token(first), continue_with=ContinueWith(NewJob("next")))],
            notes=NotificationBuffer(),
        )
        second = await claim_one(state, ["next"])
        await complete(state, second)

        everything = await state.find_chains()
        assert [c.id for c in everything.items] == [a3.id, a2.id, b1.id, a1.id]
        page = await state.find_chains(type_name="a", limit=2)
        rest = await state.find_chains(type_name="a", limit=2, after=page.next_cursor)
        assert [c.id for c in [*page.items, *rest.items]] == [a3.id, a2.id, a1.id]
        assert rest.next_cursor is None
        assert [c.id for c in (await state.find_chains(status="completed")).items] == [a1.id]
        pending = await state.find_chains(status="pending", limit=1)
        more = await state.find_chains(status="pending", limit=5, after=pending.next_cursor)
        assert [c.id for c in [*pending.items, *more.items]] == [a3.id, a2.id, b1.id]
        assert [c.id for c in (await state.find_chains(search=a2.id)).items] == [a2.id]
        by_job = await state.find_chains(search=second.id)
        assert [(c.id, c.status) for c in by_job.items] == [(a1.id, "completed")]
        assert [c.id for c in (await state.find_chains(search="order-1")).items] == [a1.id]
        assert (await state.find_chains(search="order-1", status="pending")).items == []
        assert (await state.find_chains(search="nothing")).items == []

    async def test_find_chains_finds_each_status_whatever_index_serves_it(self, state: Any) -> None:
        blocker = await start(state, "b")
        (blocked,) = await state.start_chains(
            [NewChain(NewJob("d"), blockers=[blocker.id])], notes=NotificationBuffer()
        )
        failed = await start(state, "f")
        job = await claim_one(state, ["f"])
        await state.fail_job(job.id, token(job), "boom", notes=NotificationBuffer(), final=True)
        cancelled = await start(state, "c")
        await state.cancel_chain(cancelled.id, notes=NotificationBuffer())
        running = await start(state, "r")
        await claim_one(state, ["r"])
        # A continued chain's completed first job does not make it "completed".
        continued = await start(state, "k")
        first = await claim_one(state, ["k"])
        await state.complete_jobs(
            [Completion(first.id, token(first), continue_with=ContinueWith(NewJob("k2")))],
            notes=NotificationBuffer(),
        )
        expected = {
            "blocked": [blocked.id],
            "pending": [continued.id, blocker.id],
            "running": [running.id],
            "failed": [failed.id],
            "cancelled": [cancelled.id],
            "completed": [],
        }
        for status, ids in expected.items():
            found = await state.find_chains(status=status)
            assert [c.id for c in found.items] == ids, status
            assert all(c.status == status for c in found.items)
        paged = await state.find_chains(status="pending", limit=1)
        rest = await state.find_chains(status="pending", after=paged.next_cursor)
        assert [c.id for c in [*paged.items, *rest.items]] == expected["pending"]

    @pytest.mark.parametrize(
        "bad",
        [
            {"status": "done"},
            {"limit": 0},
            {"after": "not-a-cursor"},
            {"search": "nul\x00"},
            {"type_name": 5},
        ],
    )
    async def test_find_chains_refuses_bad_filters(self, state: Any, bad: dict[str, Any]) -> None:
        with pytest.raises(InvalidInputError):
            await state.find_chains(**bad)

    async def test_chain_links_name_blockers_and_dependents(self, state: Any) -> None:
        first = await start(state, "b")
        second = await start(state, "b")
        (dependent,) = await state.start_chains(
            [NewChain(NewJob("d"), blockers=[first.id, second.id])], notes=NotificationBuffer()
        )
        links = await state.chain_links(dependent.id)
        assert sorted(links.blocked_by) == sorted([first.id, second.id])
        assert links.blocking == []
        assert (await state.chain_links(first.id)).blocking == [dependent.id]
        alone = await state.chain_links(first.id, limit=1)
        assert alone.blocked_by == []
