"""Issue #16: what the instrumentation seam costs per job run and per ``start_chains``.

Each round drives the seam exactly as the worker and the client do — for a run:
``instrumentation.active().running(job, trace_context)``, entered, the handler called
through ``handling``, ``outcome("completed")``, exited; for a start:
``starting_chains([spec])`` entered, ``started``, exited — ``--runs`` times, with no
database and no handler work, so the figures are the seam's own CPU time:

- ``none``: no ``instrument()`` (what every application pays that does not use it);
- ``otel-api``: ``instrument()`` with the API's no-op providers (the extra installed, no
  SDK configured);
- ``otel-sdk-spans`` / ``otel-sdk-metrics`` / ``otel-sdk``: the SDK with spans (a batch
  processor whose exporter drops them), metrics (an in-memory reader), or both;
- ``otel-sdk-spans-unsampled``: SDK spans under ``ParentBased(TraceIdRatioBased(0.01))``
  for jobs whose producer's span was not sampled (what sampling at the producer saves).

The jobs carry a stored trace context, as jobs started by an instrumented producer do
(sampled, except in ``otel-sdk-spans-unsampled``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from benchmarks import runner
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job
from queuert_notify.observe import instrumentation
from state_adapters.model import StartedChain

NAME = "instrumentation-cost"
HELP = "µs per job run and per start_chains the instrumentation seam costs, with and without OTel"

_VARIANTS = (
    "none",
    "otel-api",
    "otel-sdk-spans",
    "otel-sdk-metrics",
    "otel-sdk",
    "otel-sdk-spans-unsampled",
)
_SAMPLED = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
_UNSAMPLED = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="recorded rounds per variant")
    parser.add_argument("--runs", type=int, default=5000, help="runs and starts per round")
    parser.add_argument(
        "--variants", default=",".join(_VARIANTS), help=f"comma-separated: {', '.join(_VARIANTS)}"
    )


@contextmanager
def _installed(variant: str) -> Iterator[None]:
    if variant == "none":
        yield
        return
    from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
    from opentelemetry.trace import NoOpTracerProvider, TracerProvider

    from queuert_notify.otel import instrument, uninstrument

    tracer_provider: TracerProvider = NoOpTracerProvider()
    meter_provider: MeterProvider = NoOpMeterProvider()
    closers: list[Callable[[], Any]] = []
    if variant in ("otel-sdk-spans", "otel-sdk", "otel-sdk-spans-unsampled"):
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropped(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        sampled_out = variant == "otel-sdk-spans-unsampled"
        sdk_tracer = SdkTracerProvider(
            sampler=ParentBased(TraceIdRatioBased(0.01)) if sampled_out else None
        )
        sdk_tracer.add_span_processor(BatchSpanProcessor(Dropped()))
        tracer_provider = sdk_tracer
        closers.append(sdk_tracer.shutdown)
    if variant in ("otel-sdk-metrics", "otel-sdk"):
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        sdk_meter = SdkMeterProvider(metric_readers=[InMemoryMetricReader()])
        meter_provider = sdk_meter
        closers.append(sdk_meter.shutdown)
    instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield
    finally:
        uninstrument()
        for close in closers:
            close()


async def _handler() -> None:
    return None


def _variant(variant: str, runs: int) -> runner.Variant:
    now = datetime.now(UTC)
    job = Job("0" * 32, "0" * 32, 0, "bench", None, 1, 25, 0, now, now)
    spec = ChainSpec("bench")
    started = [StartedChain("0" * 32, "bench", deduplicated=False)]
    stored = _UNSAMPLED if variant == "otel-sdk-spans-unsampled" else _SAMPLED

    async def one_round() -> runner.Figures:
        with _installed(variant):
            begin = time.perf_counter()
            for _ in range(runs):
                trace = instrumentation.active().running(job, stored)
                with trace:
                    await trace.handling(_handler)()
                    trace.outcome("completed")
            per_run = (time.perf_counter() - begin) / runs
            begin = time.perf_counter()
            for _ in range(runs):
                with instrumentation.active().starting_chains([spec]) as observed:
                    observed.started(started)
            per_start = (time.perf_counter() - begin) / runs
            # The seam alone would flatter "none": the handler call it wraps is the floor.
            begin = time.perf_counter()
            for _ in range(runs):
                await _handler()
            floor = (time.perf_counter() - begin) / runs
        return {
            "µs per run": (per_run - floor) * 1e6,
            "µs per start_chains": per_start * 1e6,
        }

    return runner.Variant(variant, one_round)


async def run(args: argparse.Namespace) -> str:
    names = runner.choices(args.variants, _VARIANTS, "--variants")
    variants = [_variant(name, args.runs) for name in names]
    rows = await runner.medians(variants, args.rounds)
    return runner.report(
        "Instrumentation cost",
        [
            f"Medians of {args.rounds} alternating rounds of {args.runs:,} job runs and "
            "start_chains calls through the seam, without database or handler work (a "
            "run's figure excludes calling the handler itself):",
            runner.table(rows, first_column="instrumentation"),
        ],
        notes=[runner.machine_notes()],
    )
