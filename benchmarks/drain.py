"""Issue #5: how fast one worker drains a backlog of no-op jobs.

Each round fills fresh tables with ``--jobs`` pending jobs (untimed, in
transactions of 1,000) and refreshes their planner statistics (``ANALYZE``,
as autovacuum would on a long-lived table; ``--no-analyze`` skips it, which
is the case of a burst landing on a table the planner still thinks is
empty), then starts one :class:`Worker` (``--concurrency``
slots) and measures from its start to the last ``completed`` event: jobs/s, and
the CPU time this process spent meanwhile per job (``CPU µs/job``: only the worker
runs in it then; robust to other load on the machine, unlike the wall clock).

Handlers do no work of their own. Modes:

- ``staged``: completions are written in batches;
- ``atomic``: the handler could write through ``ctx.session`` but does not, so
  its completion is batched as in staged mode;
- ``atomic-session``: the handler runs a statement in ``ctx.session``, so each
  completion commits in the job's own transaction (what a handler that writes
  its own rows with its completion costs);
- ``atomic-log``, ``staged-log``: as ``atomic`` and ``staged``, the handler logs one
  line with ``ctx.log`` (written with the completion's batch: what a job's log costs).

``--instrumentation none,otel`` runs every variant also under
``queuert_notify.otel.instrument()`` with the OpenTelemetry SDK (a batch span processor
whose exporter drops the spans, and an in-memory metric reader): what tracing and
metrics cost a worker, exporting aside. The chains are filled under the same setting,
so each run continues a stored trace context.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select

from benchmarks import runner, stacks
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.jobs import Job, JobContext
from queuert_notify.worker.worker import Worker, WorkerMode

NAME = "drain"
HELP = "jobs/s one worker (concurrency 10) drains a backlog of no-op jobs, atomic and staged"

_FILL_BATCH = 1000
_MODES: dict[str, WorkerMode] = {
    "atomic": "atomic",
    "staged": "staged",
    "atomic-session": "atomic",
    "atomic-log": "atomic",
    "staged-log": "staged",
}
_INSTRUMENTATIONS = ("none", "otel")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="recorded rounds per variant")
    parser.add_argument(
        "--jobs", default="10000", help="comma-separated backlog sizes, e.g. 10000,50000"
    )
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--claim-ahead",
        action="store_true",
        help="the worker claims jobs ahead of its free slots while the backlog drains",
    )
    parser.add_argument(
        "--modes",
        default="atomic,staged",
        help="comma-separated: atomic, staged, atomic-session (the handler runs a statement "
        "in ctx.session, so each completion is a transaction of its own), atomic-log, "
        "staged-log (the handler logs one line with ctx.log)",
    )
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="claim from a freshly filled table without planner statistics (the worst case)",
    )
    parser.add_argument(
        "--instrumentation",
        default="none",
        help="comma-separated: none, otel (queuert_notify.otel.instrument() with the SDK, "
        "spans dropped by the exporter)",
    )
    stacks.add_stack_arguments(parser)


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


async def _in_session(job: Job, ctx: JobContext) -> None:
    # A transaction begins, so the completion commits in it, alone.
    await ctx.session.execute(select(1))


async def _one_line(job: Job, ctx: JobContext) -> None:
    ctx.log("handled", attempt=job.attempt)


_HANDLERS = {"atomic-session": _in_session, "atomic-log": _one_line, "staged-log": _one_line}


async def fill(stack: stacks.Stack, jobs: int, type_name: str = "bench-noop") -> None:
    """Start ``jobs`` chains of ``type_name`` in transactions of 1,000."""
    for offset in range(0, jobs, _FILL_BATCH):
        count = min(_FILL_BATCH, jobs - offset)
        await stack.client.start_chains([ChainSpec(type_name) for _ in range(count)])


@contextmanager
def _instrumented(instrumentation: str) -> Iterator[None]:
    """``otel``: the queue reports to an OpenTelemetry SDK whose exporter drops spans."""
    if instrumentation == "none":
        yield
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from queuert_notify.otel import instrument, uninstrument

    class Dropped(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Dropped()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield
    finally:
        uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _variant(
    state_kind: str,
    notify_kind: str,
    mode: str,
    jobs: int,
    instrumentation: str,
    args: argparse.Namespace,
) -> runner.Variant:
    async def one_round() -> runner.Figures:
        # A session per handler (atomic-session), the worker's two connections, and two more.
        pool_size = args.concurrency + 4
        with _instrumented(instrumentation):
            return await measured_round(pool_size)

    async def measured_round(pool_size: int) -> runner.Figures:
        async with stacks.open_stack(state_kind, notify_kind, args, pool_size=pool_size) as stack:
            await fill(stack, jobs)
            if args.analyze:
                await stack.analyze()
            completions = stacks.Completions(jobs)

            worker = Worker(
                await stack.new_client(),
                {"bench-noop": _HANDLERS.get(mode, _noop)},
                concurrency=args.concurrency,
                claim_ahead=args.claim_ahead,
                mode=_MODES[mode],
                on_event=completions,
            )
            started, cpu_started = time.perf_counter(), time.process_time()
            async with worker:
                async with asyncio.timeout(max(120.0, jobs / 50)):
                    await completions.done.wait()
        # Only the worker runs in this process meanwhile: its CPU time, which another
        # load on the machine changes far less than the wall clock.
        cpu_per_job = (completions.cpu_last - cpu_started) / jobs * 1e6
        return {"jobs/s": jobs / (completions.last - started), "CPU µs/job": cpu_per_job}

    name = f"{stacks.label(state_kind, notify_kind)}, {mode}, {jobs:,} jobs"
    if instrumentation != "none":
        name += f", {instrumentation}"
    return runner.Variant(name, one_round)


async def run(args: argparse.Namespace) -> str:
    modes = runner.choices(args.modes, _MODES, "--modes")
    instrumentations = runner.choices(args.instrumentation, _INSTRUMENTATIONS, "--instrumentation")
    sizes = [int(size) for size in args.jobs.split(",")]
    variants = [
        _variant(state, notify, mode, jobs, instrumentation, args)
        for jobs in sizes
        for state, notify in stacks.combinations(args)
        for mode in modes
        for instrumentation in instrumentations
    ]
    rows = await runner.medians(variants, args.rounds, warmup=0)
    return runner.report(
        "Drain throughput",
        [
            f"Medians of {args.rounds} alternating rounds; one worker, concurrency "
            f"{args.concurrency}, handlers without work (staged and atomic: batched "
            "completions; atomic-session: the handler runs a statement in ctx.session, so "
            "each completion is its own transaction), from worker start to the last "
            "completion (CPU µs/job: this process's CPU time over the same span, per job)"
            + ("" if args.analyze else "; tables not analyzed after the fill")
            + ":",
            runner.table(rows, first_column="state + notify, mode, backlog"),
        ],
        notes=[await stacks.server_notes(args), runner.machine_notes()],
    )
