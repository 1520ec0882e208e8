"""State-adapter conformance: pausing and limiting job types."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from queuert_notify.errors import InvalidInputError
from queuert_notify.testing.state_cases.support import claim, claim_one, complete, start, token
from state_adapters.model import Completion, ContinueWith, NewJob, TypeLimits
from state_adapters.notifications import NotificationBuffer
from state_adapters.steps.limited_claims import RATE_STEPS


async def _limits(state: Any, type_name: str = "t", **limits: Any) -> TypeLimits:
    values = {"concurrency": None, "key_concurrency": None, "rate": None, "per_seconds": None}
    result: TypeLimits = await state.set_limits(
        type_name, **{**values, **limits}, notes=NotificationBuffer()
    )
    return result


class ControlsCases:
    """Pause/resume and limits: cases every state adapter that supports them must pass."""

    async def test_a_paused_type_is_claimed_by_no_one_until_resumed(self, state: Any) -> None:
        paused = await start(state, "t")
        other = await start(state, "u")
        await state.pause_type("t", notes=NotificationBuffer())
        assert await state.paused_types() == {"t"}
        assert [j.id for j in await claim(state, ["t", "u"], limit=10)] == [other.id]
        assert await state.next_due_at(["t"]) is None
        notes = NotificationBuffer()
        await state.resume_type("t", notes=notes)
        assert notes.scheduled == {"t": 1}
        assert await state.paused_types() == set()
        assert (await claim_one(state, ["t"])).id == paused.id

    async def test_pausing_twice_and_resuming_an_unpaused_type_are_harmless(
        self, state: Any
    ) -> None:
        await state.pause_type("t", notes=NotificationBuffer())
        await state.pause_type("t", notes=NotificationBuffer())
        await state.resume_type("t", notes=NotificationBuffer())
        await state.resume_type("t", notes=NotificationBuffer())
        assert await state.paused_types() == set()
        assert await state.type_controls() == []

    async def test_concurrency_caps_running_jobs_and_a_completion_frees_a_slot(
        self, state: Any
    ) -> None:
        for _ in range(5):
            await start(state, "t")
        assert await _limits(state, concurrency=2) == TypeLimits("t", concurrency=2)
        running = await claim(state, limit=10)
        assert len(running) == 2
        assert await claim(state, limit=10) == []
        notes = NotificationBuffer()
        await state.complete_jobs([Completion(running[0].id, token(running[0]))], notes=notes)
        # The freed slot is announced, so a worker waiting for it wakes now.
        assert notes.scheduled == {"t": 1}
        assert len(await claim(state, limit=10)) == 1

    async def test_due_jobs_of_a_limited_type_are_due_until_a_claim_holds_them_back(
        self, state: Any
    ) -> None:
        for _ in range(3):
            await start(state, "t")
        await _limits(state, concurrency=1)
        # Limited but not claimed yet: its jobs are due (a worker claims them now).
        due = await state.next_due_at(["t"])
        assert due is not None and due <= datetime.now(UTC)
        (running,) = await claim(state, limit=10)
        assert await claim(state, limit=10) == []
        # Held back by the limit: not due (the completion that frees the slot wakes).
        due = await state.next_due_at(["t"])
        assert due is None or due > datetime.now(UTC)
        await complete(state, running)
        # The slot is free: the waiting jobs are due again.
        due = await state.next_due_at(["t"])
        assert due is not None and due <= datetime.now(UTC)

    async def test_a_key_at_its_cap_never_blocks_other_keys(self, state: Any) -> None:
        for _ in range(5):
            await start(state, "t", concurrency_key="busy")
        quiet = await start(state, "t", concurrency_key="quiet")
        await _limits(state, key_concurrency=1)
        first = await claim(state, limit=10)
        assert sorted(j.concurrency_key or "" for j in first) == ["busy", "quiet"]
        assert quiet.id in {j.id for j in first}
        assert await claim(state, limit=10) == []

    async def test_keys_are_served_round_robin(self, state: Any) -> None:
        for key in ("a", "b", "c"):
            for _ in range(3):
                await start(state, "t", concurrency_key=key)
        await _limits(state, key_concurrency=3)
        served = [(await claim_one(state)).concurrency_key or "" for _ in range(6)]
        assert sorted(served[:3]) == ["a", "b", "c"] and sorted(served[3:]) == ["a", "b", "c"]
        # With more slots than keys, each key's next jobs come in rounds.
        rest = await claim(state, limit=10)
        assert sorted(j.concurrency_key or "" for j in rest) == ["a", "b", "c"]

    async def test_jobs_without_a_key_share_one_key_of_their_own(self, state: Any) -> None:
        for _ in range(3):
            await start(state, "t")
        keyed = await start(state, "t", concurrency_key="k")
        await _limits(state, key_concurrency=1)
        jobs = await claim(state, limit=10)
        assert len(jobs) == 2 and keyed.id in {j.id for j in jobs}

    async def test_rate_allows_at_most_rate_starts_per_window(self, state: Any) -> None:
        for _ in range(10):
            await start(state, "t")
        # A window that outlasts a stall of a loaded machine between the two claims.
        per = 2.5
        await _limits(state, rate=3, per_seconds=per)
        first = await claim(state, limit=10)
        assert len(first) == 3
        assert await claim(state, limit=10) == []
        # Held back by the rate: due again when the window frees, not before (starts
        # are recorded at the end of their step of per / RATE_STEPS).
        due = await state.next_due_at(["t"])
        assert due is not None
        wait = (due - datetime.now(UTC)).total_seconds()
        assert 0 < wait <= per + per / RATE_STEPS
        await asyncio.sleep(max(wait, 0) + 0.05)
        assert len(await claim(state, limit=10)) == 3

    async def test_a_rate_added_to_a_type_limited_otherwise_holds(self, state: Any) -> None:
        # The row was written with no rate (no window) and is then given one.
        for _ in range(6):
            await start(state, "t")
        await _limits(state, concurrency=100)
        assert len(await claim(state, limit=1)) == 1
        await _limits(state, concurrency=100, rate=2, per_seconds=60)
        assert len(await claim(state, limit=10)) == 2
        assert await claim(state, limit=10) == []
        await _limits(state, rate=3, per_seconds=60)
        assert len(await claim(state, limit=10)) == 1

    async def test_none_lifts_a_limit(self, state: Any) -> None:
        for _ in range(4):
            await start(state, "t")
        await _limits(state, concurrency=1)
        assert len(await claim(state, limit=10)) == 1
        notes = NotificationBuffer()
        lifted = await state.set_limits(
            "t",
            concurrency=None,
            key_concurrency=None,
            rate=None,
            per_seconds=None,
            notes=notes,
        )
        assert lifted == TypeLimits("t") and not lifted.limited
        assert notes.scheduled == {"t": 3}
        assert await state.type_controls() == []
        assert len(await claim(state, limit=10)) == 3

    @pytest.mark.parametrize(
        "limits",
        [
            {"concurrency": 0},
            {"concurrency": -1},
            {"concurrency": True},
            {"concurrency": 1.5},
            {"key_concurrency": 10**12},
            {"rate": 10},
            {"per_seconds": 1.0},
            {"rate": 10, "per_seconds": 0},
            {"rate": 10, "per_seconds": float("inf")},
            {"rate": 10**9, "per_seconds": 1.0},
        ],
        ids=repr,
    )
    async def test_bad_limits_are_refused_before_anything_is_written(
        self, state: Any, limits: dict[str, Any]
    ) -> None:
        with pytest.raises(InvalidInputError):
            await _limits(state, **limits)
        assert await state.type_controls() == []

    async def test_a_continuation_keeps_its_chains_concurrency_key(self, state: Any) -> None:
        await start(state, "t", concurrency_key="customer-42")
        job = await claim_one(state)
        assert job.concurrency_key == "customer-42"
        await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=ContinueWith(NewJob("t")))],
            notes=NotificationBuffer(),
        )
        follow = await claim_one(state)
        assert follow.concurrency_key == "customer-42" and follow.chain_index == 1
        await complete(state, follow)

    @pytest.mark.parametrize(
        "key", ["", "k" * 256, "nul\x00", 42], ids=["empty", "too-long", "nul", "int"]
    )
    async def test_a_bad_concurrency_key_is_refused_before_anything_is_written(
        self, state: Any, key: Any
    ) -> None:
        with pytest.raises(InvalidInputError):
            await start(state, "t", concurrency_key=key)
        assert sum((await state.count_jobs()).values()) == 0
