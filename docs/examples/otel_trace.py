"""A request starts a chain; a worker runs it and its continuation; the trace is printed.

    python docs/examples/otel_trace.py

SQLite and the in-process notify adapter, so it runs without servers. The OpenTelemetry
SDK keeps the spans in memory here; an application adds an exporter instead (OTLP, for
example) to the providers it passes to ``instrument()`` or sets globally.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, Job, JobContext
from queuert_notify.notify.in_process import InProcessNotifyAdapter
from queuert_notify.otel import instrument
from queuert_notify.testing import run_until_idle
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


async def resize(job: Job, ctx: JobContext) -> Any:
    return ctx.continue_with("publish", {"path": f"/tmp/{job.input['image']}.webp"})


async def publish(job: Job, ctx: JobContext) -> Any:
    return {"published": job.input["path"]}


async def main() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metric_reader = InMemoryMetricReader()
    instrument(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[metric_reader]),
    )
    tracer = tracer_provider.get_tracer("my-web-app")

    with tempfile.TemporaryDirectory() as directory:
        engine = create_async_engine(f"sqlite+aiosqlite:///{directory}/jobs.db")
        state = SqlAlchemyStateAdapter(engine)
        await state.migrate()
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            with tracer.start_as_current_span("POST /images"):
                await client.start_chain("resize", {"image": "cat"})
            await run_until_idle(client, {"resize": resize, "publish": publish})
        await engine.dispose()

    _print_tree(list(spans.get_finished_spans()))
    print()
    data = metric_reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    shown = (
                        f"count={point.count}"
                        if isinstance(point, HistogramDataPoint)
                        else f"value={point.value}"
                    )
                    print(f"{metric.name} {dict(point.attributes or {})} {shown}")


def _print_tree(spans: list[ReadableSpan]) -> None:
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def show(span: ReadableSpan, depth: int) -> None:
        context = span.get_span_context()
        assert context is not None
        attributes = {
            key.removeprefix("queuert_notify."): value
            for key, value in (span.attributes or {}).items()
            if key.startswith("queuert_notify.") and key != "queuert_notify.job.id"
        }
        print(
            f"{'  ' * depth}{span.name} [{span.kind.name}] trace={context.trace_id:032x}"
            f"{' ' + str(attributes) if attributes else ''}"
        )
        for child in sorted(children.get(context.span_id, []), key=lambda s: s.start_time or 0):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


if __name__ == "__main__":
    asyncio.run(main())
