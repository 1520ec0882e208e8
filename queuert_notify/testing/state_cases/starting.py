"""State-adapter conformance: starting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify.errors import (
    ChainNotFoundError,
    InvalidInputError,
)
from queuert_notify.testing.state_cases.support import (
    BAD_INPUTS,
    JSON_SHAPES,
    claim,
    start,
    token,
    total_jobs,
)
from state_adapters.ids import new_id
from state_adapters.model import Completion, ContinueWith, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer


class StartingCases:
    """Starting: cases every state adapter must pass."""

    async def test_a_started_chain_is_pending_and_its_first_job_id_is_the_chain_id(
        self, state: Any
    ) -> None:
        notes = NotificationBuffer()
        (started,) = await state.start_chains([NewChain(NewJob("t", {"a": 1}))], notes=notes)
        assert started.deduplicated is False and started.type_name == "t"
        chain = await state.get_chain(started.id)
        assert chain.status == "pending" and chain.type_name == "t"
        assert chain.last_job.id == started.id and chain.last_job.chain_index == 0
        job = await state.get_job(started.id)
        assert job.input == {"a": 1} and job.attempt == 0 and job.output is None
        assert job.created_at.tzinfo is not None and job.scheduled_at <= datetime.now(UTC)
        assert notes.scheduled == {"t": 1}

    async def test_start_chains_creates_every_chain_in_order(self, state: Any) -> None:
        notes = NotificationBuffer()
        chains = [NewChain(NewJob("t" if n % 2 else "u", {"n": n})) for n in range(6)]
        started = await state.start_chains(chains, notes=notes)
        assert len({s.id for s in started}) == 6
        for n, s in enumerate(started):
            assert (await state.get_job(s.id)).input == {"n": n}
        assert notes.scheduled == {"t": 3, "u": 3}

    async def test_every_json_shape_round_trips_as_input_and_output(self, state: Any) -> None:
        values = JSON_SHAPES
        started = await state.start_chains(
            [NewChain(NewJob("t", v)) for v in values], notes=NotificationBuffer()
        )
        for s, value in zip(started, values, strict=True):
            assert (await state.get_job(s.id)).input == value
        jobs = {j.id: j for j in await claim(state, limit=len(values))}
        completions = [
            Completion(s.id, token(jobs[s.id]), output=value)
            if n % 2
            else Completion(s.id, token(jobs[s.id]), continue_with=ContinueWith(NewJob("n", value)))
            for n, (s, value) in enumerate(zip(started, values, strict=True))
        ]
        await state.complete_jobs(completions, notes=NotificationBuffer())
        for n, (s, value) in enumerate(zip(started, values, strict=True)):
            chain = await state.get_chain(s.id)
            assert (chain.output if n % 2 else chain.last_job.input) == value

    @pytest.mark.parametrize("bad", BAD_INPUTS)
    async def test_input_that_is_not_strict_json_is_rejected_before_any_write(
        self, state: Any, bad: Any
    ) -> None:
        notes = NotificationBuffer()
        with pytest.raises(InvalidInputError):
            await state.start_chains(
                [NewChain(NewJob("t", {"ok": 1})), NewChain(NewJob("t", bad))], notes=notes
            )
        assert await total_jobs(state) == 0
        assert len(notes) == 0

    @pytest.mark.parametrize(
        "chain",
        [
            pytest.param(NewChain(NewJob("")), id="empty-type"),
            pytest.param(NewChain(NewJob("  ")), id="blank-type"),
            pytest.param(NewChain(NewJob("t" * 1000)), id="long-type"),
            pytest.param(NewChain(NewJob("t"), dedup_key="k" * 1000), id="long-dedup-key"),
            pytest.param(NewChain(NewJob("t"), dedup_key=""), id="empty-dedup-key"),
            pytest.param(NewChain(NewJob("t", max_attempts=0)), id="zero-attempts"),
            pytest.param(NewChain(NewJob("t"), blockers="abc"), id="blockers-string"),
            pytest.param(NewChain(NewJob("t", run_at=datetime(2030, 1, 1))), id="naive-run-at"),
        ],
    )
    async def test_malformed_chains_are_rejected_before_any_write(
        self, state: Any, chain: NewChain
    ) -> None:
        with pytest.raises(InvalidInputError):
            await state.start_chains([NewChain(NewJob("t")), chain], notes=NotificationBuffer())
        assert await total_jobs(state) == 0

    async def test_unknown_blockers_are_rejected_before_any_write(self, state: Any) -> None:
        real = await start(state)
        with pytest.raises(ChainNotFoundError):
            await state.start_chains(
                [NewChain(NewJob("d")), NewChain(NewJob("d"), blockers=[real.id, "0" * 32])],
                notes=NotificationBuffer(),
            )
        assert await total_jobs(state) == 1

    async def test_a_chain_id_given_by_the_caller_is_used_and_get_chains_finds_it(
        self, state: Any
    ) -> None:
        chain_id = new_id()
        (started,) = await state.start_chains(
            [NewChain(NewJob("t"), id=chain_id)], notes=NotificationBuffer()
        )
        assert started.id == chain_id
        other = await start(state)
        unknown = new_id()
        found = await state.get_chains([other.id, unknown, chain_id])
        assert [c.id for c in found] == [other.id, chain_id]
        assert found[1].status == "pending" and found[1].last_job.id == chain_id
        assert await state.get_chains([]) == []

    @pytest.mark.parametrize("chain_id", ["", "abc", "A" * 32, "0" * 31 + "\x00", 7])
    async def test_a_malformed_chain_id_is_rejected_before_any_write(
        self, state: Any, chain_id: Any
    ) -> None:
        with pytest.raises(InvalidInputError):
            await state.start_chains(
                [NewChain(NewJob("t")), NewChain(NewJob("t"), id=chain_id)],
                notes=NotificationBuffer(),
            )
        twice = new_id()
        with pytest.raises(InvalidInputError, match="same id"):
            await state.start_chains(
                [NewChain(NewJob("t"), id=twice), NewChain(NewJob("t"), id=twice)],
                notes=NotificationBuffer(),
            )
        assert await total_jobs(state) == 0

    async def test_reads_and_actions_refuse_ids_and_names_no_database_can_compare(
        self, state: Any
    ) -> None:
        bad = "chain\x00id"
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: state.get_chain(bad),
            lambda: state.get_job(bad),
            lambda: state.get_chains([bad]),
            lambda: state.list_chains(type_name=bad),
            lambda: state.list_jobs(chain_id=bad),
            lambda: state.list_jobs(type_name=bad),
            lambda: state.trigger_chain(bad, notes=NotificationBuffer()),
            lambda: state.cancel_chain(bad, notes=NotificationBuffer()),
            lambda: state.complete_chain(bad, None, notes=NotificationBuffer()),
            lambda: state.delete_chain(bad),
        ]
        for call in calls:
            with pytest.raises(InvalidInputError, match="NUL"):
                await call()
        with pytest.raises(InvalidInputError, match="next_cursor"):
            await state.list_chains(after="0" * 31 + "\x00")

    async def test_a_past_run_at_means_now_and_a_future_one_waits(self, state: Any) -> None:
        now = datetime.now(UTC)
        past = await start(state, run_at=now - timedelta(hours=1))
        future = await start(state, run_at=now + timedelta(hours=1))
        assert (await state.get_job(past.id)).scheduled_at >= now - timedelta(seconds=1)
        assert (await state.get_job(future.id)).scheduled_at == now + timedelta(hours=1)
        jobs = await claim(state, limit=10)
        assert [j.id for j in jobs] == [past.id]
        assert await state.next_due_at(["t"]) == now + timedelta(hours=1)

    async def test_a_batch_schedules_each_job_at_its_own_run_at(self, state: Any) -> None:
        # A batch's statement may leave out the time of a job due now (Postgres does).
        now = datetime.now(UTC)
        run_ats = [None, now - timedelta(hours=1), now + timedelta(hours=1), None]
        started = await state.start_chains(
            [NewChain(NewJob("t", n, run_at=r)) for n, r in enumerate(run_ats)],
            notes=NotificationBuffer(),
        )
        jobs = [await state.get_job(s.id) for s in started]
        assert jobs[2].scheduled_at == now + timedelta(hours=1)
        due = [jobs[0], jobs[1], jobs[3]]
        assert all(now - timedelta(seconds=1) <= j.scheduled_at == j.created_at for j in due)
        assert {j.id for j in await claim(state, limit=10)} == {j.id for j in due}

    async def test_next_due_at_is_the_earliest_pending_job_of_the_types(self, state: Any) -> None:
        assert await state.next_due_at(["t"]) is None
        now = datetime.now(UTC)
        await start(state, "t", run_at=now + timedelta(minutes=5))
        await start(state, "t", run_at=now + timedelta(minutes=2))
        await start(state, "other", run_at=now + timedelta(minutes=1))
        assert await state.next_due_at(["t"]) == now + timedelta(minutes=2)
        assert await state.next_due_at(["t", "other"]) == now + timedelta(minutes=1)
        assert await state.next_due_at(["nothing"]) is None
