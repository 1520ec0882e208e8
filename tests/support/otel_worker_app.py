"""A traced worker application for tests that run it in its own process:
``python -m queuert_notify.cli worker tests.support.otel_worker_app:build_worker``.

Instrumented with ``queuert_notify.otel.instrument()`` and an SDK tracer provider that
appends every finished span to ``QT_SPANS_FILE`` as one JSON line (``name``,
``trace_id``, ``span_id``, ``parent_span_id`` in hex, ``kind``, ``attributes``), so the
test reads back what this process exported. Database: ``QT_DATABASE_URL`` /
``QT_TABLE_PREFIX``; no notify server (it polls every 0.1 s).

Handlers: ``traced`` continues with ``traced-next``, which opens a span of its own
(``inside traced-next``) and returns its input.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.otel import instrument
from queuert_notify.worker.worker import Worker


class JsonLinesExporter(SpanExporter):
    """Appends each exported span to a file as one JSON line."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(span_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """The parts of a span the tests compare, ids in hex."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
    }


def build_worker() -> Worker:
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["QT_SPANS_FILE"])))
    instrument(tracer_provider=provider)
    engine = create_async_engine(os.environ["QT_DATABASE_URL"])
    state = SqlAlchemyStateAdapter(engine, table_prefix=os.environ["QT_TABLE_PREFIX"])
    client = Client(state=state, notify=NoopNotifyAdapter())
    tracer = provider.get_tracer("otel_worker_app")

    async def traced(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with("traced-next", job.input)

    async def traced_next(job: Job, ctx: JobContext) -> Any:
        with tracer.start_as_current_span("inside traced-next"):
            assert trace.get_current_span().is_recording()
            return job.input

    return Worker(
        client,
        {"traced": traced, "traced-next": traced_next},
        poll_interval=0.1,
        worker_id=os.environ.get("QT_WORKER_ID"),
    )
