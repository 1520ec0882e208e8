"""Repetition, alternation, medians and markdown output shared by every benchmark.

A benchmark describes its contenders as :class:`Variant` objects whose
``run()`` performs one round and returns named figures. :func:`alternate`
runs every variant once per round, rotating the order each round so drift
(other processes, caches warming, CPU frequency) falls on every side alike;
figures are then reported as medians over rounds, and comparisons as the
median of the per-round ratios (each ratio pairs rounds run back to back).
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata

Figures = dict[str, float]
"""One round's results: figure name (with its unit, e.g. ``p50 ms``) -> value."""


@dataclass(frozen=True)
class Variant:
    """One contender: ``run()`` performs one full round and returns its figures."""

    name: str
    run: Callable[[], Awaitable[Figures]]


@dataclass
class Results:
    """Figures of every round, per variant, in the order the rounds ran."""

    rounds: dict[str, list[Figures]] = field(default_factory=dict)

    def medians(self, variant: str) -> Figures:
        """The median of each figure over the rounds of ``variant``."""
        runs = self.rounds[variant]
        return {name: statistics.median(run[name] for run in runs) for name in runs[0]}

    def all_medians(self) -> dict[str, Figures]:
        """:meth:`medians` of every variant, in the order the variants were given:
        a report's table rows."""
        return {variant: self.medians(variant) for variant in self.rounds}

    def ratio(self, numerator: str, denominator: str) -> Figures:
        """Median over rounds of ``numerator / denominator`` per figure both report,
        pairing round i of one with round i of the other (they ran back to back)."""
        pairs = list(zip(self.rounds[numerator], self.rounds[denominator], strict=True))
        return {
            name: statistics.median(
                top[name] / bottom[name] if bottom[name] else math.inf for top, bottom in pairs
            )
            for name in pairs[0][0]
            if name in pairs[0][1]
        }


async def alternate(variants: Sequence[Variant], rounds: int, *, warmup: int = 1) -> Results:
    """Run ``warmup`` unrecorded rounds, then ``rounds`` recorded ones; in round i the
    variants start at offset i, and every other round runs them in reverse, so no
    variant always runs first or always right after the same other variant (whatever
    one leaves behind -- WAL to checkpoint, tables to drop -- lands on different ones)."""
    for _ in range(warmup):
        for variant in variants:
            await variant.run()
    results = Results({variant.name: [] for variant in variants})
    for index in range(rounds):
        offset = index % len(variants)
        order = [*variants[offset:], *variants[:offset]]
        if index % 2:
            order.reverse()
        for variant in order:
            results.rounds[variant.name].append(await variant.run())
    return results


async def medians(
    variants: Sequence[Variant], rounds: int, *, warmup: int = 1
) -> dict[str, Figures]:
    """:func:`alternate`, then the medians of every variant (:meth:`Results.all_medians`):
    for a report that needs no ratio between rounds."""
    return (await alternate(variants, rounds, warmup=warmup)).all_medians()


def choices(value: str, allowed: Sequence[str], option: str) -> list[str]:
    """The comma-separated items of ``value``, each one of ``allowed``; anything else
    (or nothing) ends the benchmark with a message naming ``option`` and the choices."""
    chosen = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown or not chosen:
        raise SystemExit(
            f"{option}: unknown {unknown or value!r}; choose from {', '.join(allowed)}"
        )
    return chosen


def percentiles(samples: Sequence[float]) -> Figures:
    """p50, p90, p99 (nearest rank) and max of ``samples`` (seconds) in milliseconds;
    NaN for each when there are no samples."""
    ordered = sorted(samples)
    if not ordered:
        return dict.fromkeys(("p50 ms", "p90 ms", "p99 ms", "max ms"), math.nan)

    def rank(fraction: float) -> float:
        index = max(0, math.ceil(fraction * len(ordered)) - 1)
        return ordered[index] * 1000

    return {
        "p50 ms": rank(0.50),
        "p90 ms": rank(0.90),
        "p99 ms": rank(0.99),
        "max ms": ordered[-1] * 1000,
    }


def table(rows: Mapping[str, Figures], *, first_column: str = "variant") -> str:
    """A markdown table: one row per entry of ``rows``, one column per figure name."""
    columns = list(dict.fromkeys(name for figures in rows.values() for name in figures))
    lines = [
        "| " + " | ".join([first_column, *columns]) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for label, figures in rows.items():
        cells = [_format(figures[name]) if name in figures else "" for name in columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def _format(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def report(title: str, sections: Sequence[str], *, notes: Sequence[str] = ()) -> str:
    """A markdown section: title, the command that produced it, tables, notes."""
    command = "python -m benchmarks " + shlex.join(sys.argv[1:])
    parts = [f"### {title}", "", f"`{command}`", "", *_spaced(sections)]
    if notes:
        parts += ["", *(f"- {note}" for note in notes)]
    return "\n".join(parts) + "\n"


def _spaced(sections: Sequence[str]) -> list[str]:
    spaced: list[str] = []
    for section in sections:
        if spaced:
            spaced.append("")
        spaced.append(section)
    return spaced


def machine_notes() -> str:
    """Cores, CPU model, Python and library versions, load: what a reader needs to compare."""
    versions = ", ".join(
        f"{name} {_version(name)}"
        for name in ("redis", "hiredis", "sqlalchemy", "psycopg", "aiosqlite", "alembic")
    )
    load = "/".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({_cpu_model()}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; {versions}; load average {load} (1/5/15 min) "
        "when the report was written (the machine is shared)"
    )


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
