"""OpenTelemetry spans and metrics for the queue (extra ``otel``).

``instrument()`` makes every client and worker of this process report to OpenTelemetry:

- a producer span for each ``start_chain``/``start_chains`` call, whose context is
  stored with the first job of every chain it starts;
- a consumer span for each run of a job, the child of the span stored with the job, so
  a job run in another process continues the trace of the request that started it;
  the handler runs with that span current (its own spans nest under it), and a
  ``continue_with`` job stores it in turn;
- counters of chains started and of runs started, completed, retried and failed, the
  histograms of run duration and wake latency, and the gauges of pending and running
  jobs per type (read from the database by each worker every ``gauge_interval``).

Names and attributes are listed in docs/observability.md. Only the OpenTelemetry API is
used: the application configures the SDK and its exporters. This module is the only one
of the package that imports ``opentelemetry``; nothing imports it unless the application
does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import MeterProvider, Observation
from opentelemetry.trace import Span, SpanKind, StatusCode, TracerProvider

from queuert_notify.observe import instrumentation
from queuert_notify.observe.instrumentation import (
    ChainsStart,
    Instrumentation,
    RunOutcome,
    RunTrace,
)
from state_adapters.validation import MAX_TRACE_CONTEXT_LENGTH, check_seconds

if TYPE_CHECKING:
    from types import TracebackType

    from queuert_notify.client.chain_spec import ChainSpec
    from queuert_notify.jobs import Job
    from state_adapters.model import StartedChain
    from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCOPE = "queuert_notify"
"""The instrumentation scope of every span and metric (tracer and meter name)."""

# Attribute keys. Messaging conventions where they fit, ours where they do not.
SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
JOB_TYPE = "queuert_notify.job.type"
JOB_ID = "queuert_notify.job.id"
CHAIN_ID = "queuert_notify.chain.id"
CHAIN_INDEX = "queuert_notify.chain.index"
ATTEMPT = "queuert_notify.job.attempt"
OUTCOME = "queuert_notify.job.outcome"
DEDUPLICATED = "queuert_notify.chain.deduplicated"
CHAIN_COUNT = "queuert_notify.chain.count"

UNKNOWN_OUTCOME = "unknown"
"""The outcome of a run that ended before its outcome was written (the worker was
stopped hard, or writing it failed): the job runs again once its lease expires."""

_SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
"""Histogram buckets in seconds: queue work spans milliseconds to an hour."""


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    gauge_interval: float = 15.0,
) -> OtelInstrumentation:
    """Report spans and metrics of every client and worker of this process to
    OpenTelemetry, through ``tracer_provider`` and ``meter_provider`` (default: the
    global ones the application set up). Replaces any earlier instrumentation; runs
    already under way finish with the one they started with. ``gauge_interval``: seconds
    between a worker's reads of the pending and running jobs of its types."""
    check_seconds(gauge_interval, "gauge_interval", allow_zero=False)
    instance = OtelInstrumentation(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        gauge_interval=gauge_interval,
    )
    instrumentation.install(instance)
    return instance


def uninstrument() -> None:
    """Stop reporting: clients and workers go back to observing nothing."""
    instrumentation.install(instrumentation.NO_INSTRUMENTATION)


class OtelInstrumentation(Instrumentation):
    """The :class:`~queuert_notify.observe.instrumentation.Instrumentation` that reports to
    OpenTelemetry (see the module docstring); made by :func:`instrument`."""

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        gauge_interval: float,
    ) -> None:
        version = _version()
        self.tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, version, meter_provider=meter_provider)
        self.gauge_interval = gauge_interval
        self.chains_started = meter.create_counter(
            "queuert_notify.chains.started", "{chain}", "Chains started (not deduplicated)"
        )
        self.jobs_started = meter.create_counter(
            "queuert_notify.jobs.started", "{run}", "Runs of jobs started by workers"
        )
        self.jobs_completed = meter.create_counter(
            "queuert_notify.jobs.completed",
            "{run}",
            "Runs whose completion (or continuation) was written",
        )
        self.jobs_retried = meter.create_counter(
            "queuert_notify.jobs.retried", "{run}", "Runs that failed and will be retried"
        )
        self.jobs_failed = meter.create_counter(
            "queuert_notify.jobs.failed", "{run}", "Runs that failed with no attempts left"
        )
        self.run_duration = meter.create_histogram(
            "queuert_notify.job.run.duration",
            "s",
            "From a run's start to its outcome written",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.wake_latency = meter.create_histogram(
            "queuert_notify.job.wake_latency",
            "s",
            "From the moment a job was due (scheduled_at) to its run's start",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self._gauges: list[_QueueGauge] = []
        meter.create_observable_gauge(
            "queuert_notify.jobs.pending",
            [lambda _options: self._observe("pending")],
            "{job}",
            "Pending jobs per type, as last read by a worker of the type",
        )
        meter.create_observable_gauge(
            "queuert_notify.jobs.running",
            [lambda _options: self._observe("running")],
            "{job}",
            "Running jobs per type, as last read by a worker of the type",
        )

    def starting_chains(self, specs: Sequence[ChainSpec]) -> ChainsStart:
        return _OtelChainsStart(self, specs)

    def running(self, job: Job, trace_context: str | None) -> RunTrace:
        return _OtelRun(self, job, trace_context)

    def observing(
        self, state: StateAdapter, type_names: Sequence[str]
    ) -> AbstractAsyncContextManager[None]:
        return self._reading_gauges(state, type_names)

    @asynccontextmanager
    async def _reading_gauges(
        self, state: StateAdapter, type_names: Sequence[str]
    ) -> AsyncIterator[None]:
        gauge = _QueueGauge(state, tuple(type_names))
        self._gauges.append(gauge)
        task = asyncio.create_task(gauge.run(self.gauge_interval), name="queuert-otel-gauges")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._gauges.remove(gauge)

    def _observe(self, status: str) -> Iterable[Observation]:
        # Called by the metric reader, possibly on its own thread: reads only counts
        # each gauge replaced whole.
        for gauge in list(self._gauges):
            for type_name, by_status in gauge.counts.items():
                yield Observation(by_status.get(status, 0), {JOB_TYPE: type_name})

    def inject(self, span: Span) -> str | None:
        """The stored form of ``span``'s context: the propagators' carrier as JSON."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        if not carrier:
            return None
        stored = json.dumps(carrier, separators=(",", ":"))
        return stored if len(stored) <= MAX_TRACE_CONTEXT_LENGTH else None

    def extract(self, trace_context: str | None) -> otel_context.Context | None:
        """The context a run continues (``None``: a new trace)."""
        if trace_context is None:
            return None
        try:
            carrier = json.loads(trace_context)
            if not isinstance(carrier, dict):
                raise ValueError("not a JSON object")
            return propagate.extract({str(k): str(v) for k, v in carrier.items()})
        except ValueError:
            # Written by someone else: the run starts a trace of its own.
            logger.debug("ignoring a stored trace context that is not a carrier")
            return None


class _OtelChainsStart(ChainsStart):
    """The producer span of one ``start_chains`` call."""

    def __init__(self, owner: OtelInstrumentation, specs: Sequence[ChainSpec]) -> None:
        self._owner = owner
        self._specs = specs
        types = {spec.type_name for spec in specs}
        self._type_name = next(iter(types)) if len(types) == 1 else None
        self._span: Span | None = None

    def __enter__(self) -> ChainsStart:
        attributes: dict[str, Any] = {
            SYSTEM: SCOPE,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "start_chains",
            CHAIN_COUNT: len(self._specs),
        }
        if self._type_name is not None:
            attributes[JOB_TYPE] = attributes[DESTINATION] = self._type_name
        if len(self._specs) > 1:
            attributes[BATCH_COUNT] = len(self._specs)
        name = "start_chains" if self._type_name is None else f"start_chains {self._type_name}"
        # Not made current: the write may start long-lived tasks (notification
        # senders), which would otherwise keep this span as their parent.
        self._span = self._owner.tracer.start_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        )
        self.trace_context = self._owner.inject(self._span)
        return self

    def started(self, chains: Sequence[StartedChain]) -> None:
        assert self._span is not None
        if len(chains) == 1:
            self._span.set_attribute(CHAIN_ID, chains[0].id)
            self._span.set_attribute(DEDUPLICATED, chains[0].deduplicated)
        for chain in chains:
            if not chain.deduplicated:
                self._owner.chains_started.add(1, {JOB_TYPE: chain.type_name})

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        if exc is not None:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        span.end()


class _OtelRun(RunTrace):
    """The consumer span and the metrics of one run."""

    def __init__(self, owner: OtelInstrumentation, job: Job, trace_context: str | None) -> None:
        self._owner = owner
        self._job = job
        self._trace_context = trace_context
        self._span: Span | None = None
        self._parent: otel_context.Context | None = None
        self._outcome: RunOutcome | None = None
        self._started = 0.0
        self._type = {JOB_TYPE: job.type_name}

    def __enter__(self) -> RunTrace:
        owner, job = self._owner, self._job
        self._started = time.perf_counter()
        self._parent = owner.extract(self._trace_context)
        self._span = owner.tracer.start_span(
            f"run {job.type_name}",
            context=self._parent,
            kind=SpanKind.CONSUMER,
            attributes={
                SYSTEM: SCOPE,
                OPERATION_TYPE: "process",
                OPERATION_NAME: "run",
                DESTINATION: job.type_name,
                MESSAGE_ID: job.id,
                JOB_TYPE: job.type_name,
                JOB_ID: job.id,
                CHAIN_ID: job.chain_id,
                CHAIN_INDEX: job.chain_index,
                ATTEMPT: job.attempt,
            },
        )
        owner.jobs_started.add(1, self._type)
        owner.wake_latency.record(max(0.0, time.time() - job.scheduled_at.timestamp()), self._type)
        return self

    def handling(self, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        span, parent = self._span, self._parent

        async def in_span() -> T:
            # Current in the handler's task (and the thread of a plain def, which gets a
            # copy of this context): what the handler traces nests under the run, and the
            # producer's baggage is the handler's (and goes on to a continue_with job).
            token = otel_context.attach(trace.set_span_in_context(span, parent)) if span else None
            try:
                return await call()
            finally:
                if token is not None:
                    otel_context.detach(token)

        return in_span

    def outcome(self, outcome: RunOutcome, error: BaseException | str | None = None) -> None:
        self._outcome = outcome
        span, owner = self._span, self._owner
        if span is None:
            return
        span.set_attribute(OUTCOME, outcome)
        if outcome == "completed":
            owner.jobs_completed.add(1, self._type)
            return
        if outcome == "retried":
            owner.jobs_retried.add(1, self._type)
        elif outcome == "failed":
            owner.jobs_failed.add(1, self._type)
        if isinstance(error, BaseException):
            span.record_exception(error)
        if outcome in ("retried", "failed"):
            description = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            span.set_status(StatusCode.ERROR, description)

    def continuation_context(self) -> str | None:
        return None if self._span is None else self._owner.inject(self._span)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        outcome = self._outcome or UNKNOWN_OUTCOME
        if self._outcome is None:
            span.set_attribute(OUTCOME, outcome)
            if exc is not None:
                span.record_exception(exc)
            span.set_status(StatusCode.ERROR, "the run ended before its outcome was written")
        self._owner.run_duration.record(
            time.perf_counter() - self._started, {**self._type, OUTCOME: outcome}
        )
        span.end()


class _QueueGauge:
    """The pending and running jobs of one worker's types, re-read every interval while
    the worker runs; a failed read keeps the last counts."""

    def __init__(self, state: StateAdapter, type_names: tuple[str, ...]) -> None:
        self._state = state
        self._type_names = type_names
        self.counts: dict[str, dict[str, int]] = {}

    async def run(self, interval: float) -> None:
        failing = False
        while True:
            try:
                counts = await self._state.count_active_jobs(self._type_names)
            except Exception:
                # Once per outage: the worker's own loop reports the database's state.
                if not failing:
                    logger.warning(
                        "reading the pending/running gauges failed; retrying every %.0fs",
                        interval,
                        exc_info=True,
                    )
                failing = True
            else:
                self.counts = {name: dict(by_status) for name, by_status in counts.items()}
                failing = False
            await asyncio.sleep(interval)


def _version() -> str:
    try:
        return metadata.version("queuert-notify")
    except metadata.PackageNotFoundError:
        return ""
