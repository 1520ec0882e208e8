"""What happens to a handler's result: outputs, continuations, errors, retries, progress."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from queuert_notify.client.client import Client
from queuert_notify.errors import InvalidInputError
from queuert_notify.events import WorkerEvent
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker
from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS
from tests.support.queue_helpers import wait_until

pytest_plugins = ["tests.support.queue_fixtures"]


def _fast_retries(attempt: int) -> float:
    return 0.01


async def test_output_completes_the_chain(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> dict[str, Any]:
        return {"doubled": job.input["n"] * 2}

    chain = await client.start_chain("double", {"n": 21})
    async with Worker(client, {"double": handler}):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.status == "completed"
    assert done.output == {"doubled": 42}


async def test_continue_with_runs_the_next_job_of_the_same_chain(client: Client) -> None:
    seen: list[Job] = []

    async def fetch(job: Job, ctx: JobContext) -> Any:
        seen.append(job)
        return ctx.continue_with("store", {"body": "hello"})

    async def store(job: Job, ctx: JobContext) -> Any:
        seen.append(job)
        return {"stored": job.input["body"]}

    chain = await client.start_chain("fetch", {"url": "u"})
    async with Worker(client, {"fetch": fetch, "store": store}):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.output == {"stored": "hello"}
    assert [(j.type_name, j.chain_id, j.chain_index) for j in seen] == [
        ("fetch", chain.id, 0),
        ("store", chain.id, 1),
    ]
    assert seen[0].id == chain.id


async def test_plain_function_handler_runs_off_the_event_loop_thread(client: Client) -> None:
    threads: list[int] = []

    def handler(job: Job, ctx: JobContext) -> str:
        threads.append(threading.get_ident())
        return "ok"

    chain = await client.start_chain("sync")
    async with Worker(client, {"sync": handler}):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.output == "ok"
    assert threads and threads[0] != threading.get_ident()


async def test_raising_handler_is_retried_then_fails_after_max_attempts(client: Client) -> None:
    events: list[WorkerEvent] = []
    attempts: list[int] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        attempts.append(job.attempt)
        raise RuntimeError(f"boom on attempt {job.attempt}")

    chain = await client.start_chain("flaky", max_attempts=3)
    async with Worker(
        client, {"flaky": handler}, retry_backoff=_fast_retries, on_event=events.append
    ):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert attempts == [1, 2, 3]
    assert "boom on attempt 3" in (done.last_job.last_error or "")
    assert [e.kind for e in events if e.kind in ("retried", "failed")] == [
        "retried",
        "retried",
        "failed",
    ]


def _raises(attempt: int) -> float:
    raise ZeroDivisionError("bad backoff")


@pytest.mark.parametrize(
    "backoff",
    [_raises, lambda a: float("nan"), lambda a: -1, lambda a: "5", lambda a: 1e13],
    ids=["raises", "nan", "negative", "string", "1e13"],
)
async def test_a_bad_retry_backoff_keeps_the_handlers_error(client: Client, backoff: Any) -> None:
    async def handler(job: Job, ctx: JobContext) -> None:
        raise RuntimeError(f"the real error, attempt {job.attempt}")

    chain = await client.start_chain("flaky", max_attempts=2)
    async with Worker(client, {"flaky": handler}, retry_backoff=backoff, lease=60.0):
        # The default backoff (not a lease expiry, a minute away) schedules the retry.
        await wait_until(lambda: _failed_once(client, chain.id), timeout=5.0)
        retrying = await client.get_chain(chain.id)
    assert retrying.status == "pending"
    assert "RuntimeError: the real error, attempt 1" in (retrying.last_job.last_error or "")


async def _failed_once(client: Client, chain_id: str) -> bool:
    return (await client.get_chain(chain_id)).last_job.last_error is not None


def test_a_retry_backoff_that_is_not_callable_is_refused(client: Client) -> None:
    with pytest.raises(InvalidInputError, match="retry_backoff must be a callable"):
        Worker(client, {"flaky": lambda job, ctx: None}, retry_backoff=5)  # type: ignore[arg-type]


async def test_jobs_get_finite_attempts_by_default(client: Client) -> None:
    chain = await client.start_chain("job")
    assert (await client.get_chain(chain.id)).last_job.max_attempts == DEFAULT_MAX_ATTEMPTS
    assert 1 < DEFAULT_MAX_ATTEMPTS < 100


async def test_continuations_inherit_the_chains_max_attempts(client: Client) -> None:
    attempts: list[tuple[str, int]] = []

    async def start(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("inherits")

    async def always_fails(job: Job, ctx: JobContext) -> Any:
        attempts.append((job.type_name, job.attempt))
        raise RuntimeError("boom")

    async def inherits(job: Job, ctx: JobContext) -> Any:
        attempts.append((job.type_name, job.attempt))
        if job.attempt < 3:
            raise RuntimeError("not yet")
        return ctx.continue_with("overrides", max_attempts=1)

    chain = await client.start_chain("start", max_attempts=3)
    handlers = {"start": start, "inherits": inherits, "overrides": always_fails}
    async with Worker(client, handlers, retry_backoff=_fast_retries):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert attempts == [("inherits", 1), ("inherits", 2), ("inherits", 3), ("overrides", 1)]


async def test_a_continuation_made_but_not_returned_fails_the_chain_at_once(
    client: Client,
) -> None:
    attempts: list[int] = []

    async def handler(job: Job, ctx: JobContext) -> dict[str, bool]:
        attempts.append(job.attempt)
        ctx.continue_with("next-step", {"n": 1})  # forgot `return`
        return {"done": True}

    chain = await client.start_chain("forgetful", max_attempts=5)
    async with Worker(client, {"forgetful": handler, "next-step": lambda job, ctx: None}):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert attempts == [1]
    assert "ctx.continue_with(...) without returning its result" in (done.last_job.last_error or "")


async def test_a_configuration_error_in_a_handler_is_not_retried(client: Client) -> None:
    attempts: list[int] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        attempts.append(job.attempt)
        ctx.session  # noqa: B018  # staged mode has no session

    chain = await client.start_chain("misused", max_attempts=5)
    async with Worker(client, {"misused": handler}, mode="staged"):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert attempts == [1]
    assert "ctx.session exists only in atomic mode" in (done.last_job.last_error or "")


async def test_a_plain_def_handler_cannot_use_the_async_session(client: Client) -> None:
    def handler(job: Job, ctx: JobContext) -> None:
        ctx.session  # noqa: B018

    chain = await client.start_chain("sync", max_attempts=5)
    async with Worker(client, {"sync": handler}, mode="atomic"):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert "cannot be used from a plain def handler" in (done.last_job.last_error or "")


async def test_handler_that_recovers_on_retry_completes(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> int:
        if job.attempt < 2:
            raise ConnectionError("dependency down")
        return job.attempt

    chain = await client.start_chain("flaky", max_attempts=5)
    async with Worker(client, {"flaky": handler}, retry_backoff=_fast_retries):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "completed"
    assert done.output == 2


async def test_output_that_is_not_json_fails_the_attempt(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> object:
        return object()

    chain = await client.start_chain("bad-output", max_attempts=1)
    async with Worker(client, {"bad-output": handler}):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.status == "failed"
    assert "JSON" in (done.last_job.last_error or "")


async def test_handler_timeout_fails_the_attempt(client: Client) -> None:
    async def handler(job: Job, ctx: JobContext) -> None:
        await asyncio.sleep(10)

    chain = await client.start_chain("slow", max_attempts=1)
    async with Worker(client, {"slow": handler}, handler_timeout=0.2):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.status == "failed"
    assert "timed out" in (done.last_job.last_error or "")


async def test_progress_is_stored_on_the_job_and_reported(client: Client) -> None:
    events: list[WorkerEvent] = []
    stored: list[Any] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        await ctx.set_progress({"done": 1, "of": 2})
        stored.append((await client.get_job(job.id)).progress)

    chain = await client.start_chain("long")
    async with Worker(client, {"long": handler}, on_event=events.append):
        await client.await_chain(chain.id, timeout=5)
    assert stored == [{"done": 1, "of": 2}]
    assert [e.progress for e in events if e.kind == "progress"] == [{"done": 1, "of": 2}]


async def test_every_job_reports_started_then_completed(client: Client) -> None:
    events: list[WorkerEvent] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        return None

    chain = await client.start_chain("t")
    async with Worker(client, {"t": handler}, on_event=events.append, worker_id="w-1"):
        await client.await_chain(chain.id, timeout=5)
        await asyncio.sleep(0.05)
    assert [(e.kind, e.job_id, e.worker_id, e.attempt) for e in events] == [
        ("started", chain.id, "w-1", 1),
        ("completed", chain.id, "w-1", 1),
    ]


async def test_a_raising_event_callback_changes_nothing(client: Client) -> None:
    def on_event(event: WorkerEvent) -> None:
        raise ValueError("observer bug")

    async def handler(job: Job, ctx: JobContext) -> str:
        return "fine"

    chain = await client.start_chain("t")
    async with Worker(client, {"t": handler}, on_event=on_event):
        done = await client.await_chain(chain.id, timeout=5)
    assert done.output == "fine"


@pytest.mark.parametrize("bad", [{}, {"": lambda job, ctx: None}, {"t": "not callable"}])
async def test_worker_rejects_bad_handler_maps(client: Client, bad: Any) -> None:
    from queuert_notify.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        Worker(client, bad)
