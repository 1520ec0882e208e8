"""State-adapter conformance: the trace context stored with a job."""

from __future__ import annotations

from typing import Any

from queuert_notify.testing.state_cases.support import claim_one, start, token
from state_adapters.model import Completion, ContinueWith, NewChain, NewJob
from state_adapters.notifications import NotificationBuffer

_FIRST = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
_NEXT = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"}'


class TraceContextCases:
    """The trace context a job was created with comes back, unchanged, on every read of
    it (``acquire``, ``get_job``, listings), for first jobs and continuations alike."""

    async def test_a_first_jobs_trace_context_comes_back_when_it_is_claimed(
        self, state: Any
    ) -> None:
        chains = [
            NewChain(NewJob("traced", {"n": 1}, trace_context=_FIRST)),
            NewChain(NewJob("traced", {"n": 2})),
        ]
        started = await state.start_chains(chains, notes=NotificationBuffer())
        first = await claim_one(state, ["traced"])
        second = await claim_one(state, ["traced"])
        assert (first.trace_context, second.trace_context) == (_FIRST, None)
        assert (await state.get_job(started[0].id)).trace_context == _FIRST
        listed = await state.list_jobs(chain_id=started[0].id)
        assert [job.trace_context for job in listed.items] == [_FIRST]

    async def test_a_continuation_keeps_the_trace_context_it_was_given(self, state: Any) -> None:
        started = await start(state, "first")
        job = await claim_one(state, ["first"])
        follow = ContinueWith(NewJob("second", trace_context=_NEXT))
        (done,) = await state.complete_jobs(
            [Completion(job.id, token(job), continue_with=follow)], notes=NotificationBuffer()
        )
        assert done.trace_context is None
        second = await claim_one(state, ["second"])
        assert second.trace_context == _NEXT
        assert (await state.get_chain(started.id)).last_job.trace_context == _NEXT

    async def test_a_continuation_written_with_a_claim_keeps_its_trace_context(
        self, state: Any
    ) -> None:
        await start(state, "first")
        job = await claim_one(state, ["first"])
        follow = ContinueWith(NewJob("second", trace_context=_NEXT))
        lost, claimed = await state.complete_and_acquire(
            [Completion(job.id, token(job), continue_with=follow)],
            notes=NotificationBuffer(),
            type_names=["second"],
            worker_id="worker-1",
            lease_seconds=30.0,
            limit=1,
        )
        assert lost == [None]
        assert [j.trace_context for j in claimed] == [_NEXT]
