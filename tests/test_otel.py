"""``queuert_notify.otel.instrument()``: a job's run continues the trace of the request
that started it (in this process and in a worker process), its span says how the run
ended, the metrics count runs by type, and an application that never instruments
imports no OpenTelemetry at all."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from queuert_notify import Client, Job, JobContext, Worker
from queuert_notify.otel import instrument, uninstrument
from queuert_notify.testing import run_until_idle
from tests.support.queue_helpers import sync_url
from tests.support.worker_processes import REPO, WorkerProcesses

pytest_plugins = ["tests.support.queue_fixtures"]

both_stacks = pytest.mark.parametrize(
    ("state_kind", "notify_kind"),
    [("sqlite", "in_process"), ("postgres", "redis"), ("asyncpg", "redis")],
    indirect=True,
)


class Telemetry:
    """What this process exported: finished spans and the metrics read on demand."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        (found,) = [s for s in self.spans() if s.name == name]
        return found

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], Any]:
        """(metric name, attributes) -> value (sums, gauges) or count (histograms)."""
        points: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        key = (metric.name, frozenset((point.attributes or {}).items()))
                        points[key] = (
                            point.count if isinstance(point, HistogramDataPoint) else point.value
                        )
        return points

    def metric(self, name: str, **attributes: Any) -> Any:
        return self.metrics().get((name, frozenset(attributes.items())))


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    recorded = Telemetry()
    instrument(
        tracer_provider=recorded.tracer_provider,
        meter_provider=recorded.meter_provider,
        gauge_interval=0.05,
    )
    try:
        yield recorded
    finally:
        uninstrument()
        recorded.tracer_provider.shutdown()
        recorded.meter_provider.shutdown()


def _ids(span: ReadableSpan) -> tuple[int, int, int | None]:
    """(trace id, span id, parent span id)."""
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id, None if span.parent is None else span.parent.span_id


@both_stacks
async def test_a_chain_and_its_continuation_run_in_the_trace_of_the_request_that_started_it(
    client: Client, telemetry: Telemetry
) -> None:
    async def first(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("second", {"n": job.input["n"] + 1})

    async def second(job: Job, ctx: JobContext) -> Any:
        with telemetry.tracer.start_as_current_span("the handler's own work"):
            return {"n": job.input["n"] * 10}

    with telemetry.tracer.start_as_current_span("POST /signup") as request_span:
        chain = await client.start_chain("first", {"n": 1})
        # The producer span is never left current: the request goes on in its own span.
        assert trace.get_current_span() is request_span
    assert await run_until_idle(client, {"first": first, "second": second}) == 2

    request, producer = telemetry.span("POST /signup"), telemetry.span("start_chains first")
    run_first, run_second = telemetry.span("run first"), telemetry.span("run second")
    own = telemetry.span("the handler's own work")
    trace_id, request_id, _ = _ids(request)
    assert {_ids(s)[0] for s in (producer, run_first, run_second, own)} == {trace_id}
    assert _ids(producer)[2] == request_id
    assert _ids(run_first)[2] == _ids(producer)[1]
    assert _ids(run_second)[2] == _ids(run_first)[1]
    assert _ids(own)[2] == _ids(run_second)[1]

    assert producer.kind is SpanKind.PRODUCER and run_first.kind is SpanKind.CONSUMER
    assert producer.attributes is not None
    assert producer.attributes["queuert_notify.chain.id"] == chain.id
    assert producer.attributes["queuert_notify.job.type"] == "first"
    stored = await client.get_job(chain.id)
    assert run_second.attributes is not None and run_first.attributes is not None
    assert (
        dict(run_first.attributes).items()
        >= {
            "queuert_notify.job.type": "first",
            "queuert_notify.job.id": stored.id,
            "queuert_notify.chain.id": chain.id,
            "queuert_notify.chain.index": 0,
            "queuert_notify.job.attempt": 1,
            "queuert_notify.job.outcome": "completed",
            "messaging.system": "queuert_notify",
        }.items()
    )
    assert run_second.attributes["queuert_notify.chain.index"] == 1
    assert run_second.attributes["queuert_notify.job.outcome"] == "completed"
    assert run_second.status.status_code is StatusCode.UNSET


async def test_the_requests_baggage_reaches_the_handlers_of_the_chain(
    client: Client, telemetry: Telemetry
) -> None:
    from opentelemetry import baggage, context

    seen: list[object] = []

    async def first(job: Job, ctx: JobContext) -> Any:
        seen.append(baggage.get_baggage("tenant"))
        return ctx.continue_with("second")

    def second(job: Job, ctx: JobContext) -> Any:  # a plain def: runs in a thread
        seen.append(baggage.get_baggage("tenant"))
        return None

    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        await client.start_chain("first")
    finally:
        context.detach(token)
    assert await run_until_idle(client, {"first": first, "second": second}) == 2
    assert seen == ["acme", "acme"]


async def test_a_retried_attempt_and_the_failed_last_one_are_error_spans_under_the_producer(
    client: Client, telemetry: Telemetry
) -> None:
    async def flaky(job: Job, ctx: JobContext) -> Any:
        raise ValueError(f"attempt {job.attempt} broke")

    chain = await client.start_chain("flaky", max_attempts=2)
    async with Worker(client, {"flaky": flaky}, retry_backoff=lambda attempt: 0.0):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"

    producer = telemetry.span("start_chains flaky")
    runs = sorted(
        (s for s in telemetry.spans() if s.name == "run flaky"),
        key=lambda s: s.attributes["queuert_notify.job.attempt"] if s.attributes else 0,
    )
    assert [_ids(run)[2] for run in runs] == [_ids(producer)[1]] * 2
    outcomes = [(r.attributes or {}).get("queuert_notify.job.outcome") for r in runs]
    assert outcomes == ["retried", "failed"]
    for attempt, run in enumerate(runs, start=1):
        assert run.status.status_code is StatusCode.ERROR
        assert f"attempt {attempt} broke" in (run.status.description or "")
        (event,) = run.events
        assert event.name == "exception" and event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"

    assert (
        telemetry.metric("queuert_notify.jobs.started", **{"queuert_notify.job.type": "flaky"}) == 2
    )
    assert (
        telemetry.metric("queuert_notify.jobs.retried", **{"queuert_notify.job.type": "flaky"}) == 1
    )
    assert (
        telemetry.metric("queuert_notify.jobs.failed", **{"queuert_notify.job.type": "flaky"}) == 1
    )
    assert (
        telemetry.metric("queuert_notify.jobs.completed", **{"queuert_notify.job.type": "flaky"})
        is None
    )


async def test_a_run_the_worker_abandons_on_a_forced_stop_ends_its_span_as_abandoned(
    client: Client, telemetry: Telemetry
) -> None:
    started = asyncio.Event()

    async def stuck(job: Job, ctx: JobContext) -> Any:
        started.set()
        await asyncio.Event().wait()

    await client.start_chain("stuck")
    worker = Worker(client, {"stuck": stuck})
    async with worker:
        await asyncio.wait_for(started.wait(), 10)
        await worker.stop(force=True)

    run = telemetry.span("run stuck")
    assert (run.attributes or {}).get("queuert_notify.job.outcome") == "abandoned"
    assert run.status.status_code is StatusCode.UNSET
    assert run.end_time is not None


@both_stacks
async def test_metrics_count_runs_by_type_and_the_gauges_show_pending_and_running_jobs(
    client: Client, telemetry: Telemetry
) -> None:
    release = asyncio.Event()
    running = asyncio.Event()

    async def slow(job: Job, ctx: JobContext) -> Any:
        running.set()
        await release.wait()
        return None

    await client.start_chains([*_specs("slow", 3)])
    type_slow = {"queuert_notify.job.type": "slow"}
    async with Worker(client, {"slow": slow}, concurrency=1):
        await asyncio.wait_for(running.wait(), 10)
        deadline = time.monotonic() + 10
        while (
            telemetry.metric("queuert_notify.jobs.pending", **type_slow),
            telemetry.metric("queuert_notify.jobs.running", **type_slow),
        ) != (2, 1):
            assert time.monotonic() < deadline, telemetry.metrics()
            await asyncio.sleep(0.05)
        release.set()
        while (telemetry.metric("queuert_notify.jobs.completed", **type_slow) or 0) < 3:
            assert time.monotonic() < deadline, telemetry.metrics()
            await asyncio.sleep(0.05)

    assert telemetry.metric("queuert_notify.chains.started", **type_slow) == 3
    assert telemetry.metric("queuert_notify.jobs.started", **type_slow) == 3
    assert (
        telemetry.metric(
            "queuert_notify.job.run.duration",
            **type_slow,
            **{"queuert_notify.job.outcome": "completed"},
        )
        == 3
    )
    assert telemetry.metric("queuert_notify.job.wake_latency", **type_slow) == 3


def _specs(type_name: str, count: int) -> list[Any]:
    from queuert_notify import ChainSpec

    return [ChainSpec(type_name, {"i": i}) for i in range(count)]


@pytest.mark.parametrize(("state_kind", "notify_kind"), [("postgres", "noop")], indirect=True)
async def test_a_job_run_by_a_worker_process_continues_the_producers_trace(
    client: Client, database_url: str, table_prefix: str, tmp_path: Path, telemetry: Telemetry
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    workers = WorkerProcesses(
        {
            "QT_DATABASE_URL": database_url,
            "QT_TABLE_PREFIX": table_prefix,
            "QT_SPANS_FILE": str(spans_file),
        },
        tmp_path,
        app="tests.support.otel_worker_app:build_worker",
    )
    try:
        workers.start("traced-worker")
        with telemetry.tracer.start_as_current_span("POST /orders"):
            chain = await client.start_chain("traced", {"order": 7})
        done = await client.await_chain(chain.id, timeout=30)
        assert (done.status, done.output) == ("completed", {"order": 7}), workers.log(
            "traced-worker"
        )
        deadline = time.monotonic() + 10
        while len(_read_spans(spans_file)) < 3:
            assert time.monotonic() < deadline, workers.log("traced-worker")
            await asyncio.sleep(0.05)
    finally:
        workers.kill_all()

    producer = telemetry.span("start_chains traced")
    trace_id, producer_id, _ = _ids(producer)
    exported = {span["name"]: span for span in _read_spans(spans_file)}
    run, run_next = exported["run traced"], exported["run traced-next"]
    inside = exported["inside traced-next"]
    assert {s["trace_id"] for s in (run, run_next, inside)} == {f"{trace_id:032x}"}
    assert run["parent_span_id"] == f"{producer_id:016x}"
    assert run_next["parent_span_id"] == run["span_id"]
    assert inside["parent_span_id"] == run_next["span_id"]
    assert run["kind"] == "CONSUMER"
    assert run["attributes"]["queuert_notify.chain.id"] == chain.id
    assert run_next["attributes"]["queuert_notify.job.outcome"] == "completed"


async def test_a_chain_started_by_a_sync_client_runs_in_the_trace_of_its_request(
    client: Client, database_url: str, table_prefix: str, telemetry: Telemetry
) -> None:
    from sqlalchemy import create_engine

    from queuert_notify import SyncClient

    async def handled(job: Job, ctx: JobContext) -> Any:
        return None

    engine = create_engine(sync_url(database_url))
    try:
        with telemetry.tracer.start_as_current_span("POST /legacy"):
            await asyncio.to_thread(
                lambda: SyncClient(engine, table_prefix=table_prefix).start_chain("handled")
            )
    finally:
        engine.dispose()
    assert await run_until_idle(client, {"handled": handled}) == 1

    request, producer = telemetry.span("POST /legacy"), telemetry.span("start_chains handled")
    run = telemetry.span("run handled")
    assert _ids(producer)[2] == _ids(request)[1]
    assert _ids(run)[2] == _ids(producer)[1]
    assert _ids(run)[0] == _ids(request)[0]


@pytest.mark.parametrize("stored", [None, "not a carrier", '["a", "list"]'])
async def test_a_job_stored_without_a_usable_trace_context_runs_in_a_trace_of_its_own(
    client: Client, telemetry: Telemetry, stored: str | None
) -> None:
    from state_adapters.model import NewChain, NewJob
    from state_adapters.notifications import NotificationBuffer

    async def handled(job: Job, ctx: JobContext) -> Any:
        return None

    await client.state.start_chains(
        [NewChain(NewJob("handled", trace_context=stored))], notes=NotificationBuffer()
    )
    assert await run_until_idle(client, {"handled": handled}) == 1

    run = telemetry.span("run handled")
    assert run.parent is None
    assert (run.attributes or {}).get("queuert_notify.job.outcome") == "completed"


def _read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_an_application_that_never_instruments_imports_no_opentelemetry(tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
from sqlalchemy.ext.asyncio import create_async_engine
import queuert_notify
from queuert_notify import Client, Worker
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.testing import run_until_idle
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

async def main():
    engine = create_async_engine("sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine)
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        async def first(job, ctx):
            return ctx.continue_with("second")
        async def second(job, ctx):
            return "done"
        chain = await client.start_chain("first")
        assert await run_until_idle(client, {{"first": first, "second": second}}) == 2
        assert (await client.get_chain(chain.id)).status == "completed"
    await engine.dispose()

asyncio.run(main())
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
