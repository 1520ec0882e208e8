"""``queuert-notify demo``: chains through several workers, then a summary table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from queuert_notify.cli.database import check_reachable, create_engine
from queuert_notify.cli.output import console, line, run
from queuert_notify.errors import mask_url

if TYPE_CHECKING:
    from queuert_notify.demo import DemoReport


@click.command()
@click.option(
    "--database-url",
    default=None,
    help="Run on this database instead of a fresh SQLite file (tables get a unique "
    "prefix and are dropped afterwards).",
)
@click.option("--redis-url", default=None, help="Use Redis notify instead of in-process.")
@click.option("--chains", default=3000, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default=10, show_default=True, type=click.IntRange(1))
@click.option(
    "--mode", type=click.Choice(["atomic", "staged"]), default="atomic", show_default=True
)
def demo(
    database_url: str | None,
    redis_url: str | None,
    chains: int,
    workers: int,
    concurrency: int,
    mode: str,
) -> None:
    """Run chains with continuations, a blocker and retries through several workers,
    then print throughput and wake latency. Needs no server by default."""
    from queuert_notify.demo import engine_options, run_demo

    engine = create_engine(database_url, **engine_options(workers)) if database_url else None
    where = mask_url(database_url) if database_url else "a fresh SQLite file"
    via = mask_url(redis_url) if redis_url else "in-process notify"
    console().print(
        line(
            ("queuert-notify demo", "bold"),
            f": {chains} chains x 3 jobs, {workers} workers x "
            f"{concurrency} slots ({mode} mode), on {where} with {via}",
        )
    )

    async def go() -> DemoReport:
        try:
            if engine is not None and database_url:
                await check_reachable(engine, database_url)
            with Progress(
                TextColumn("chains"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(),
            ) as bar:
                task = bar.add_task("chains", total=chains + 2)
                return await run_demo(
                    engine=engine,
                    redis_url=redis_url,
                    chains=chains,
                    workers=workers,
                    concurrency=concurrency,
                    mode="staged" if mode == "staged" else "atomic",
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
        finally:
            if engine is not None:
                await engine.dispose()

    console().print(_summary_table(run(go())))


def _summary_table(report: DemoReport) -> Table:
    from queuert_notify.demo import latency_summary

    table = Table(title="demo summary", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("database", report.database)
    table.add_row("notify adapter", report.notify)
    table.add_row("workers x concurrency", f"{report.workers} x {report.concurrency}")
    table.add_row("mode", report.mode)
    table.add_row("chains finished", str(report.chains))
    table.add_row("jobs run", str(report.jobs))
    table.add_row("elapsed", f"{report.seconds:.2f} s")
    table.add_row("throughput", f"{report.jobs_per_second:,.0f} jobs/s")
    table.add_row(
        "wake latency p50 / p90 / p99",
        f"{latency_summary(report)} ms  ({len(report.wake_latencies_ms)} idle probes, "
        "commit -> handler start)",
    )
    table.add_row("retries", str(report.retries))
    table.add_row("failed chains", f"{report.failures} (1 fails on purpose)")
    table.add_row(
        "final job statuses",
        ", ".join(f"{k}: {v}" for k, v in sorted(report.final_statuses.items())),
    )
    return table
