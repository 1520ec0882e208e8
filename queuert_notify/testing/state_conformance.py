"""The state-adapter contract as a pytest base class.

Subclass :class:`StateAdapterConformance` and provide an async fixture named
``state`` that yields a migrated adapter with tables of the test's own (a
unique table prefix), dropped at teardown::

    class TestMyState(StateAdapterConformance):
        @pytest.fixture
        async def state(self, tmp_path):
            engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
            adapter = SqlAlchemyStateAdapter(engine, table_prefix="t_")
            await adapter.migrate()
            yield adapter
            await engine.dispose()

The transactional tests (``session=``) need the adapter's ``engine`` attribute
(an ``AsyncEngine``) and are skipped without one. Timing-based tests use leases
of a fraction of a second, so the suite runs in well under a minute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.errors import (
    ChainInUseError,
    ChainNotFoundError,
    InvalidInputError,
    JobNotFoundError,
    JobOwnershipLostError,
)
from queuert_notify.hooks import NotificationBuffer
from state_adapters.ids import new_id
from state_adapters.protocol import (
    Completion,
    ContinueWith,
    JobRecord,
    NewChain,
    NewJob,
    StartedChain,
)

SHORT_LEASE = 0.3
"""Seconds; tests that need a lease to expire sleep a little longer than this."""


async def start(
    state: Any, type_name: str = "t", input: Any = None, **options: Any
) -> StartedChain:
    """Start one chain (``options``: NewChain fields, or NewJob fields)."""
    job_fields = {k: options.pop(k) for k in ("run_at", "priority", "max_attempts") if k in options}
    chain = NewChain(NewJob(type_name, input, **job_fields), **options)
    started: StartedChain
    (started,) = await state.start_chains([chain], notes=NotificationBuffer())
    return started


async def claim(
    state: Any,
    types: Sequence[str] = ("t",),
    *,
    limit: int = 1,
    lease: float = 30.0,
    worker: str = "worker-1",
) -> list[JobRecord]:
    return list(
        await state.acquire(list(types), worker_id=worker, lease_seconds=lease, limit=limit)
    )


async def claim_one(state: Any, types: Sequence[str] = ("t",), **kwargs: Any) -> JobRecord:
    jobs = await claim(state, types, **kwargs)
    assert len(jobs) == 1, f"expected one claimable job of {list(types)}, got {jobs}"
    return jobs[0]


async def complete(state: Any, job: JobRecord, output: Any = None) -> JobRecord:
    (result,) = await state.complete_jobs(
        [Completion(job.id, token(job), output=output)], notes=NotificationBuffer()
    )
    assert isinstance(result, JobRecord), result
    return result


def token(job: JobRecord) -> str:
    """The lease token of a claimed job."""
    assert job.lease_token is not None, f"job {job.id} is not leased"
    return job.lease_token


async def total_jobs(state: Any) -> int:
    return sum((await state.count_jobs()).values())


def engine_of(state: Any) -> AsyncEngine:
    engine = getattr(state, "engine", None)
    if not isinstance(engine, AsyncEngine):
        pytest.skip("the adapter has no `engine` attribute (AsyncEngine) for session tests")
    return engine


JSON_SHAPES: list[Any] = [
    None,
    True,
    0,
    -7,
    1.5,
    "text",
    "",
    [],
    [1, 2],
    [[1], [2, [3]]],
    [None],
    {},
    {"nested": {"list": [1, {"x": None}]}, "unicode": "h\u00e9llo \u2603"},
]


class _NotJson:
    pass


BAD_INPUTS = [
    pytest.param(_NotJson(), id="object"),
    pytest.param({"x": float("nan")}, id="nan"),
    pytest.param({"x": float("inf")}, id="infinity"),
    pytest.param({1, 2}, id="set"),
    pytest.param({"at": datetime(2030, 1, 1, tzinfo=UTC)}, id="datetime"),
    pytest.param(b"bytes", id="bytes"),
]


class StateAdapterConformance:
    """Behaviour every state adapter must show; see the module docstring."""

    # -- starting ----------------------------------------------------------------------

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

    async def test_next_due_at_is_the_earliest_pending_job_of_the_types(self, state: Any) -> None:
        assert await state.next_due_at(["t"]) is None
        now = datetime.now(UTC)
        await start(state, "t", run_at=now + timedelta(minutes=5))
        await start(state, "t", run_at=now + timedelta(minutes=2))
        await start(state, "other", run_at=now + timedelta(minutes=1))
        assert await state.next_due_at(["t"]) == now + timedelta(minutes=2)
        assert await state.next_due_at(["t", "other"]) == now + timedelta(minutes=1)
        assert await state.next_due_at(["nothing"]) is None

    # -- acquiring ---------------------------------------------------------------------

    async def test_acquire_marks_the_job_running_under_a_fresh_lease(self, state: Any) -> None:
        started = await start(state)
        before = datetime.now(UTC)
        job = await claim_one(state, lease=60, worker="w-7")
        assert job.id == started.id and job.status == "running" and job.attempt == 1
        assert job.leased_by == "w-7" and job.lease_token
        assert job.leased_until is not None
        assert before + timedelta(seconds=59) <= job.leased_until
        assert job.leased_until <= datetime.now(UTC) + timedelta(seconds=61)
        assert (await state.get_job(job.id)).status == "running"
        assert await claim(state) == []

    async def test_acquire_takes_the_best_job_by_priority_then_schedule_then_id(
        self, state: Any
    ) -> None:
        now = datetime.now(UTC)
        late = await start(state, priority=0, input="late")
        early = await start(state, priority=0, run_at=now - timedelta(hours=1), input="early")
        urgent = await start(state, priority=-5, input="urgent")
        low = await start(state, priority=10, run_at=now - timedelta(hours=2), input="low")
        order = [(await claim_one(state)).id for _ in range(4)]
        # "early" asked for a past instant, which is stored as now: it ties with
        # "late" on scheduled_at or comes first; the id breaks ties by age.
        assert order[0] == urgent.id and order[-1] == low.id
        assert set(order[1:3]) == {late.id, early.id}

    async def test_acquire_only_claims_the_requested_types(self, state: Any) -> None:
        await start(state, "a")
        b = await start(state, "b")
        await start(state, "c")
        jobs = await claim(state, ["b", "x"], limit=10)
        assert [j.id for j in jobs] == [b.id]
        assert await claim(state, [], limit=10) == []

    async def test_batch_acquire_takes_up_to_limit_in_order(self, state: Any) -> None:
        started = [await start(state, priority=n) for n in range(5)]
        jobs = await claim(state, limit=3)
        assert [j.id for j in jobs] == [s.id for s in started[:3]]
        assert len({j.lease_token for j in jobs}) == 3
        rest = await claim(state, limit=10)
        assert [j.id for j in rest] == [s.id for s in started[3:]]

    async def test_ten_concurrent_acquirers_over_five_jobs_make_five_distinct_claims(
        self, state: Any
    ) -> None:
        for _ in range(5):
            await start(state)
        results = await asyncio.gather(*(claim(state, worker=f"w{n}") for n in range(10)))
        claimed = [job.id for jobs in results for job in jobs]
        assert len(claimed) == 5 and len(set(claimed)) == 5

    async def test_concurrent_batch_acquirers_never_share_a_job(self, state: Any) -> None:
        for _ in range(12):
            await start(state)
        results = await asyncio.gather(*(claim(state, limit=5, worker=f"w{n}") for n in range(4)))
        claimed = [job.id for jobs in results for job in jobs]
        assert len(claimed) == 12 and len(set(claimed)) == 12

    # -- leases --------------------------------------------------------------------------

    async def test_renew_lease_extends_it_and_a_stale_token_is_refused(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state, lease=1)
        until = await state.renew_lease(job.id, token(job), 120)
        assert until > datetime.now(UTC) + timedelta(seconds=100)
        assert (await state.get_job(job.id)).leased_until == until
        with pytest.raises(JobOwnershipLostError):
            await state.renew_lease(job.id, "0" * 32, 120)
        assert (await state.get_job(job.id)).leased_until == until

    async def test_progress_is_stored_under_the_lease_only(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state)
        await state.set_progress(job.id, job.lease_token, {"done": 3, "of": 10})
        assert (await state.get_job(job.id)).progress == {"done": 3, "of": 10}
        with pytest.raises(JobOwnershipLostError):
            await state.set_progress(job.id, "0" * 32, {"done": 99})
        with pytest.raises(InvalidInputError):
            await state.set_progress(job.id, job.lease_token, {"x": float("nan")})
        assert (await state.get_job(job.id)).progress == {"done": 3, "of": 10}

    # -- completing ----------------------------------------------------------------------

    async def test_completing_the_last_job_completes_the_chain(self, state: Any) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        (done,) = await state.complete_jobs(
            [Completion(job.id, token(job), output={"sent": True})], notes=notes
        )
        assert isinstance(done, JobRecord) and done.status == "completed"
        assert done.output == {"sent": True} and done.completed_at is not None
        chain = await state.get_chain(started.id)
        assert chain.status == "completed" and chain.output == {"sent": True}
        assert chain.completed_at is not None
        assert notes.completed_chains == [started.id]

    async def test_continue_with_creates_the_next_job_of_the_chain(self, state: Any) -> None:
        started = await start(state, "first", {"n": 1})
        job = await claim_one(state, ["first"])
        notes = NotificationBuffer()
        follow = ContinueWith(NewJob("second", {"n": 2}, priority=3))
        (done,) = await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=follow)], notes=notes
        )
        assert isinstance(done, JobRecord) and done.status == "completed"
        chain = await state.get_chain(started.id)
        assert chain.status == "pending" and chain.type_name == "first"
        assert chain.last_job.type_name == "second" and chain.last_job.chain_index == 1
        assert chain.last_job.input == {"n": 2} and chain.last_job.priority == 3
        assert notes.scheduled == {"second": 1} and notes.completed_chains == []
        second = await claim_one(state, ["second"])
        assert second.chain_id == started.id
        await complete(state, second, "end")
        chain = await state.get_chain(started.id)
        assert chain.status == "completed" and chain.output == "end"
        page = await state.list_jobs(chain_id=started.id)
        assert [j.chain_index for j in page.items] == [0, 1]

    async def test_a_stale_completion_changes_nothing_and_others_in_the_batch_apply(
        self, state: Any
    ) -> None:
        await start(state, input=1)
        await start(state, input=2)
        a, b = await claim(state, limit=2)
        notes = NotificationBuffer()
        results = await state.complete_jobs(
            [
                Completion(a.id, "0" * 32, output="stale"),
                Completion(b.id, token(b), output="fresh"),
            ],
            notes=notes,
        )
        assert isinstance(results[0], JobOwnershipLostError)
        assert isinstance(results[1], JobRecord) and results[1].output == "fresh"
        untouched = await state.get_job(a.id)
        assert untouched.status == "running" and untouched.output is None
        assert notes.completed_chains == [b.chain_id]

    async def test_a_job_completed_twice_in_one_batch_completes_once(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state)
        results = await state.complete_jobs(
            [
                Completion(job.id, token(job), output=1),
                Completion(job.id, token(job), output=2),
            ],
            notes=NotificationBuffer(),
        )
        assert isinstance(results[0], JobRecord) and results[0].output == 1
        assert isinstance(results[1], JobOwnershipLostError)
        assert (await state.get_job(job.id)).output == 1

    async def test_output_that_is_not_strict_json_is_rejected_before_any_write(
        self, state: Any
    ) -> None:
        await start(state)
        job = await claim_one(state)
        with pytest.raises(InvalidInputError):
            await state.complete_jobs(
                [Completion(job.id, token(job), output=float("nan"))],
                notes=NotificationBuffer(),
            )
        assert (await state.get_job(job.id)).status == "running"

    # -- failing and retrying ------------------------------------------------------------

    async def test_a_failed_attempt_returns_to_pending_after_the_retry_delay(
        self, state: Any
    ) -> None:
        await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        before = datetime.now(UTC)
        outcome = await state.fail_job(job.id, job.lease_token, "boom", notes=notes, retry_delay=60)
        assert outcome.status == "pending" and outcome.retry_at is not None
        assert before + timedelta(seconds=59) <= outcome.retry_at
        stored = await state.get_job(job.id)
        assert stored.status == "pending" and stored.last_error == "boom"
        assert stored.scheduled_at == outcome.retry_at
        assert await claim(state) == []
        assert notes.scheduled == {"t": 1}
        with pytest.raises(JobOwnershipLostError):
            await state.fail_job(job.id, job.lease_token, "again", notes=notes)

    async def test_retries_count_attempts_and_back_off(self, state: Any) -> None:
        started = await start(state)
        waits = []
        for attempt in (1, 2, 3):
            job = await claim_one(state)
            assert job.attempt == attempt
            before = datetime.now(UTC)
            outcome = await state.fail_job(
                job.id, job.lease_token, f"fail {attempt}", notes=NotificationBuffer()
            )
            assert outcome.status == "pending" and outcome.retry_at is not None
            waits.append((outcome.retry_at - before).total_seconds())
            await state.trigger_chain(started.id, notes=NotificationBuffer())
        assert waits[0] >= 0 and waits[2] >= waits[0]

    async def test_exhausted_attempts_fail_the_job_and_the_chain(self, state: Any) -> None:
        started = await start(state, max_attempts=2)
        for _ in range(2):
            job = await claim_one(state)
            notes = NotificationBuffer()
            outcome = await state.fail_job(
                job.id, job.lease_token, "boom", notes=notes, retry_delay=0
            )
        assert outcome.status == "failed" and outcome.retry_at is None
        assert notes.completed_chains == [started.id]
        chain = await state.get_chain(started.id)
        assert chain.status == "failed" and chain.completed_at is not None
        assert chain.last_job.attempt == 2 and chain.last_job.last_error == "boom"
        assert await claim(state) == []

    # -- reaping -------------------------------------------------------------------------

    async def test_an_expired_lease_is_reaped_back_to_pending(self, state: Any) -> None:
        await start(state)
        job = await claim_one(state, lease=SHORT_LEASE)
        notes = NotificationBuffer()
        assert await state.reap_expired_leases(["t"], notes=notes) == []
        await asyncio.sleep(SHORT_LEASE + 0.2)
        assert await state.reap_expired_leases(["other"], notes=notes) == []
        assert await state.reap_expired_leases(["t"], notes=notes) == [job.id]
        assert notes.lost_jobs == [job.id] and notes.scheduled == {"t": 1}
        stored = await state.get_job(job.id)
        assert stored.status == "pending" and stored.last_error
        again = await claim_one(state)
        assert again.id == job.id and again.attempt == 2
        assert again.lease_token != job.lease_token

    async def test_reaping_a_job_without_attempts_left_fails_its_chain(self, state: Any) -> None:
        started = await start(state, max_attempts=1)
        await claim_one(state, lease=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE + 0.2)
        notes = NotificationBuffer()
        assert await state.reap_expired_leases(None, notes=notes) == [started.id]
        assert (await state.get_chain(started.id)).status == "failed"
        assert notes.completed_chains == [started.id] and notes.lost_jobs == [started.id]

    async def test_overlapping_reapers_reap_each_job_once(self, state: Any) -> None:
        for _ in range(5):
            await start(state)
        jobs = await claim(state, limit=5, lease=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE + 0.2)
        results = await asyncio.gather(
            *(state.reap_expired_leases(["t"], notes=NotificationBuffer()) for _ in range(4))
        )
        reaped = [job_id for ids in results for job_id in ids]
        assert sorted(reaped) == sorted(j.id for j in jobs)

    async def test_a_zombie_completion_after_reap_and_reclaim_changes_nothing(
        self, state: Any
    ) -> None:
        await start(state)
        zombie = await claim_one(state, lease=SHORT_LEASE, worker="zombie")
        await asyncio.sleep(SHORT_LEASE + 0.2)
        await state.reap_expired_leases(["t"], notes=NotificationBuffer())
        owner = await claim_one(state, worker="owner")
        notes = NotificationBuffer()
        (late,) = await state.complete_jobs(
            [Completion(zombie.id, token(zombie), output="zombie")], notes=notes
        )
        assert isinstance(late, JobOwnershipLostError) and len(notes) == 0
        for write in (
            state.renew_lease(zombie.id, zombie.lease_token, 60),
            state.set_progress(zombie.id, zombie.lease_token, "zombie"),
            state.fail_job(zombie.id, zombie.lease_token, "zombie", notes=notes),
        ):
            with pytest.raises(JobOwnershipLostError):
                await write
        row = await state.get_job(owner.id)
        assert row.status == "running" and row.leased_by == "owner"
        assert row.lease_token == owner.lease_token and row.leased_until == owner.leased_until
        assert row.output is None and row.progress is None and row.last_error == owner.last_error
        assert (await complete(state, owner, "owner")).output == "owner"

    # -- application-side actions --------------------------------------------------------

    async def test_cancelling_a_pending_chain(self, state: Any) -> None:
        started = await start(state)
        notes = NotificationBuffer()
        chain = await state.cancel_chain(started.id, notes=notes)
        assert chain.status == "cancelled" and chain.completed_at is not None
        assert notes.completed_chains == [started.id] and notes.lost_jobs == []
        assert await claim(state) == []

    async def test_cancelling_a_running_chain_takes_the_job_from_its_worker(
        self, state: Any
    ) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        assert (await state.cancel_chain(started.id, notes=notes)).status == "cancelled"
        assert notes.lost_jobs == [job.id] and notes.completed_chains == [started.id]
        (late,) = await state.complete_jobs(
            [Completion(job.id, token(job), output=1)], notes=NotificationBuffer()
        )
        assert isinstance(late, JobOwnershipLostError)
        assert (await state.get_chain(started.id)).status == "cancelled"

    async def test_cancelling_a_final_chain_changes_nothing(self, state: Any) -> None:
        started = await start(state)
        await complete(state, await claim_one(state), "done")
        notes = NotificationBuffer()
        chain = await state.cancel_chain(started.id, notes=notes)
        assert chain.status == "completed" and chain.output == "done" and len(notes) == 0

    async def test_trigger_makes_a_scheduled_job_due_now(self, state: Any) -> None:
        started = await start(state, run_at=datetime.now(UTC) + timedelta(hours=1))
        assert await claim(state) == []
        notes = NotificationBuffer()
        chain = await state.trigger_chain(started.id, notes=notes)
        assert chain.last_job.scheduled_at <= datetime.now(UTC)
        assert notes.scheduled == {"t": 1}
        assert (await claim_one(state)).id == started.id

    async def test_workerless_completion_completes_the_chain(self, state: Any) -> None:
        started = await start(state)
        notes = NotificationBuffer()
        chain = await state.complete_chain(started.id, {"approved": True}, notes=notes)
        assert chain.status == "completed" and chain.output == {"approved": True}
        assert notes.completed_chains == [started.id] and notes.lost_jobs == []
        assert await claim(state) == []

    async def test_workerless_completion_takes_a_running_job_from_its_worker(
        self, state: Any
    ) -> None:
        started = await start(state)
        job = await claim_one(state)
        notes = NotificationBuffer()
        await state.complete_chain(started.id, "by hand", notes=notes)
        assert notes.lost_jobs == [job.id]
        with pytest.raises(JobOwnershipLostError):
            await state.renew_lease(job.id, token(job), 60)
        assert (await state.get_chain(started.id)).output == "by hand"

    async def test_unknown_ids_raise_typed_errors(self, state: Any) -> None:
        missing = "0" * 32
        notes = NotificationBuffer()
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(missing)
        with pytest.raises(JobNotFoundError):
            await state.get_job(missing)
        for action in (
            state.cancel_chain(missing, notes=notes),
            state.trigger_chain(missing, notes=notes),
            state.complete_chain(missing, None, notes=notes),
            state.delete_chain(missing),
        ):
            with pytest.raises(ChainNotFoundError):
                await action
        assert len(notes) == 0

    async def test_deleting_a_chain_removes_it_and_its_jobs(self, state: Any) -> None:
        started = await start(state, "first", dedup_key="k")
        job = await claim_one(state, ["first"])
        follow = ContinueWith(NewJob("second"))
        await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=follow)],
            notes=NotificationBuffer(),
        )
        await state.delete_chain(started.id)
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(started.id)
        assert await total_jobs(state) == 0
        again = await start(state, "first", dedup_key="k")
        assert again.deduplicated is False

    async def test_a_chain_others_are_blocked_on_cannot_be_deleted(self, state: Any) -> None:
        blocker = await start(state, "b")
        dependent = await start(state, "d", blockers=[blocker.id])
        with pytest.raises(ChainInUseError):
            await state.delete_chain(blocker.id)
        assert (await state.get_chain(blocker.id)).status == "pending"
        await state.delete_chain(dependent.id)
        await state.delete_chain(blocker.id)
        assert await total_jobs(state) == 0

    # -- listing -------------------------------------------------------------------------

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

    # -- blockers ------------------------------------------------------------------------

    async def test_a_blocked_job_waits_for_every_blocker_chain(self, state: Any) -> None:
        first = await start(state, "b", 1)
        second = await start(state, "b", 2)
        notes = NotificationBuffer()
        (dependent,) = await state.start_chains(
            [NewChain(NewJob("d"), blockers=[first.id, second.id])], notes=notes
        )
        assert notes.scheduled == {}
        assert (await state.get_chain(dependent.id)).status == "blocked"
        assert await claim(state, ["d"]) == []
        assert await state.next_due_at(["d"]) is None
        await complete(state, await claim_one(state, ["b"]))
        assert (await state.get_chain(dependent.id)).status == "blocked"
        job = await claim_one(state, ["b"])
        notes = NotificationBuffer()
        await state.complete_jobs([Completion(job.id, token(job))], notes=notes)
        assert notes.scheduled == {"d": 1}
        assert (await state.get_chain(dependent.id)).status == "pending"
        assert (await claim_one(state, ["d"])).id == dependent.id

    async def test_a_final_blocker_does_not_hold_a_new_job_back(self, state: Any) -> None:
        done = await start(state, "b")
        await complete(state, await claim_one(state, ["b"]))
        failed = await start(state, "b", max_attempts=1)
        job = await claim_one(state, ["b"])
        await state.fail_job(job.id, job.lease_token, "x", notes=NotificationBuffer())
        dependent = await start(state, "d", blockers=[done.id, failed.id])
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_cancelled_or_failed_blocker_releases_its_dependents(self, state: Any) -> None:
        blocker = await start(state, "b")
        dependent = await start(state, "d", blockers=[blocker.id])
        notes = NotificationBuffer()
        await state.cancel_chain(blocker.id, notes=notes)
        assert notes.scheduled == {"d": 1}
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_blocker_completing_while_a_dependent_is_added_never_strands_it(
        self, state: Any
    ) -> None:
        for _ in range(8):
            blocker = await start(state, "b")
            job = await claim_one(state, ["b"])
            dependent, _ = await asyncio.gather(
                start(state, "d", blockers=[blocker.id]), complete(state, job)
            )
            assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_a_dependent_added_in_an_open_transaction_is_released_by_its_blocker(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        blocker = await start(state, "b")
        job = await claim_one(state, ["b"])
        async with AsyncSession(engine) as session, session.begin():
            (dependent,) = await state.start_chains(
                [NewChain(NewJob("d"), blockers=[blocker.id])],
                notes=NotificationBuffer(),
                session=session,
            )
            completing = asyncio.ensure_future(complete(state, job))
            # The completer now waits for this transaction (row lock or write lock).
            await asyncio.sleep(0.3)
        await completing
        assert (await state.get_chain(dependent.id)).status == "pending"
        assert (await claim_one(state, ["d"])).id == dependent.id

    async def test_a_dependent_added_while_its_blocker_completes_sees_it_complete(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        blocker = await start(state, "b")
        job = await claim_one(state, ["b"])
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(job.id, token(job))],
                notes=NotificationBuffer(),
                session=session,
            )
            starting = asyncio.ensure_future(start(state, "d", blockers=[blocker.id]))
            await asyncio.sleep(0.3)
        dependent = await starting
        assert (await state.get_chain(dependent.id)).status == "pending"

    async def test_two_blockers_completing_at_once_release_their_dependent(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        first, second = await start(state, "b"), await start(state, "b")
        dependent = await start(state, "d", blockers=[first.id, second.id])
        a, b = await claim(state, ["b"], limit=2)
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(a.id, token(a))], notes=NotificationBuffer(), session=session
            )
            other = asyncio.ensure_future(complete(state, b))
            await asyncio.sleep(0.3)
        await other
        assert (await state.get_chain(dependent.id)).status == "pending"

    # -- deduplication -------------------------------------------------------------------

    async def test_a_dedup_key_returns_the_existing_incomplete_chain(self, state: Any) -> None:
        first = await start(state, dedup_key="k")
        notes = NotificationBuffer()
        (again,) = await state.start_chains(
            [NewChain(NewJob("t", "other input"), dedup_key="k")], notes=notes
        )
        assert again.id == first.id and again.deduplicated is True
        assert notes.scheduled == {}
        other_type = await start(state, "u", dedup_key="k")
        assert other_type.id != first.id and other_type.deduplicated is False
        assert await total_jobs(state) == 2

    async def test_a_dedup_key_is_free_again_once_its_chain_completed(self, state: Any) -> None:
        first = await start(state, dedup_key="k")
        await complete(state, await claim_one(state))
        second = await start(state, dedup_key="k")
        assert second.id != first.id and second.deduplicated is False
        third = await start(state, dedup_key="k")
        assert third.id == second.id and third.deduplicated is True

    async def test_dedup_scope_ever_returns_a_completed_chain(self, state: Any) -> None:
        first = await start(state, dedup_key="k", dedup_scope="ever")
        await complete(state, await claim_one(state))
        again = await start(state, dedup_key="k", dedup_scope="ever")
        assert again.id == first.id and again.deduplicated is True

    async def test_a_dedup_window_limits_how_long_a_key_deduplicates(self, state: Any) -> None:
        # A window wide enough that a loaded machine still starts `inside` within it.
        first = await start(state, dedup_key="k", dedup_window=1.5)
        inside = await start(state, dedup_key="k", dedup_window=1.5)
        assert inside.id == first.id and inside.deduplicated is True
        await asyncio.sleep(1.6)
        after = await start(state, dedup_key="k", dedup_window=1.5)
        assert after.id != first.id and after.deduplicated is False

    async def test_duplicates_within_one_batch_make_one_chain(self, state: Any) -> None:
        started = await state.start_chains(
            [NewChain(NewJob("t", n), dedup_key="k") for n in range(3)],
            notes=NotificationBuffer(),
        )
        assert len({s.id for s in started}) == 1
        assert [s.deduplicated for s in started] == [False, True, True]
        assert await total_jobs(state) == 1

    async def test_three_concurrent_starts_with_one_key_make_one_chain(self, state: Any) -> None:
        results = await asyncio.gather(*(start(state, input=n, dedup_key="k") for n in range(3)))
        assert len({r.id for r in results}) == 1
        assert sorted(r.deduplicated for r in results) == [False, True, True]
        assert await total_jobs(state) == 1

    async def test_a_start_waiting_on_an_uncommitted_key_gets_that_chain_once_committed(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session, session.begin():
            (held,) = await state.start_chains(
                [NewChain(NewJob("t"), dedup_key="k")],
                notes=NotificationBuffer(),
                session=session,
            )
            waiting = asyncio.ensure_future(start(state, dedup_key="k"))
            await asyncio.sleep(0.3)
        again = await waiting
        assert again.id == held.id and again.deduplicated is True
        assert await total_jobs(state) == 1

    async def test_a_start_waiting_on_a_key_whose_holder_rolls_back_takes_the_key(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session, session.begin():
            (held,) = await state.start_chains(
                [NewChain(NewJob("t"), dedup_key="k")],
                notes=NotificationBuffer(),
                session=session,
            )
            waiting = asyncio.ensure_future(start(state, dedup_key="k"))
            await asyncio.sleep(0.3)
            await session.rollback()
        mine = await waiting
        assert mine.id != held.id and mine.deduplicated is False
        assert (await state.get_chain(mine.id)).status == "pending"

    # -- transactional enqueue -----------------------------------------------------------

    async def test_a_chain_started_in_a_session_exists_only_once_the_session_commits(
        self, state: Any
    ) -> None:
        engine = engine_of(state)
        async with AsyncSession(engine) as session:
            async with session.begin():
                started = await start_in(state, session)
                assert (await state.get_chain(started.id, session=session)).status == "pending"
            assert (await state.get_chain(started.id)).status == "pending"
            async with session.begin():
                rolled_back = await start_in(state, session)
                await session.rollback()
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(rolled_back.id)

    async def test_writes_through_a_connection_join_its_transaction(self, state: Any) -> None:
        engine = engine_of(state)
        async with engine.connect() as connection:
            async with connection.begin():
                kept = await start_in(state, connection)
            transaction = await connection.begin()
            dropped = await start_in(state, connection)
            await transaction.rollback()
        assert (await state.get_chain(kept.id)).status == "pending"
        with pytest.raises(ChainNotFoundError):
            await state.get_chain(dropped.id)

    async def test_a_completion_in_a_rolled_back_session_leaves_the_lease(self, state: Any) -> None:
        engine = engine_of(state)
        started = await start(state)
        job = await claim_one(state)
        async with AsyncSession(engine) as session, session.begin():
            await state.complete_jobs(
                [Completion(job.id, token(job), output="x")],
                notes=NotificationBuffer(),
                session=session,
            )
            await session.rollback()
        assert (await state.get_chain(started.id)).status == "running"
        assert (await complete(state, job, "y")).output == "y"


async def start_in(state: Any, session: Any, type_name: str = "t") -> StartedChain:
    started: StartedChain
    (started,) = await state.start_chains(
        [NewChain(NewJob(type_name))], notes=NotificationBuffer(), session=session
    )
    return started
