"""What ``python -m benchmarks churn`` counts from the effects rows of its worker app
(:mod:`benchmarks.chaos_app`): lost and doubled jobs, re-runs after a kill, and the most
jobs running at once against the limits in force."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GRACE = 1.5
"""Seconds a limit is still honoured after a change: workers follow within a second."""


@dataclass(frozen=True)
class Limits:
    """Limits of the type from ``since`` (epoch seconds) on; None: no limit."""

    since: float
    concurrency: int | None
    key_concurrency: int | None
    rate: int | None


def doubled_and_reruns(rows: Sequence[Any], killed: set[str], atomic: bool) -> tuple[int, int]:
    """(jobs completed twice, extra runs of jobs whose earlier run was in a killed process).

    Atomic: a second committed row is a job completed twice, whoever ran it. Staged: an
    extra row is a re-run when every earlier row of the job came from a SIGKILLed process
    and had another attempt number; otherwise the job was completed twice."""
    by_job: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_job[row.job_id].append(row)
    doubled = reruns = 0
    for runs in by_job.values():
        if len(runs) == 1:
            continue
        runs.sort(key=lambda row: row.started)
        earlier_killed = all(row.worker_id in killed for row in runs[:-1])
        distinct_attempts = len({row.attempt for row in runs}) == len(runs)
        if atomic or not (earlier_killed and distinct_attempts):
            doubled += 1
        else:
            reruns += len(runs) - 1
    return doubled, reruns


def _allowed(phases: Sequence[Limits], start: float, end: float, field: str) -> float:
    """The largest limit ``field`` in force at some instant of [start, end] (a phase lasts
    until GRACE after the next one begins)."""
    most = 0.0
    for index, phase in enumerate(phases):
        until = phases[index + 1].since + GRACE if index + 1 < len(phases) else math.inf
        if phase.since <= end and until >= start:
            value = getattr(phase, field)
            most = max(most, math.inf if value is None else float(value))
    return most


def most_running(
    rows: Sequence[Any], phases: Sequence[Limits], field: str = "concurrency"
) -> tuple[int, float, int]:
    """(most runs at once, the cap then, instants over the cap) over the runs of ``rows``
    (their [started, ended]); a run counts against every limit in force since its claim."""
    starts = [(row.started, 1, row) for row in rows]
    events = sorted(starts + [(row.ended, -1, row) for row in rows], key=lambda e: (e[0], e[1]))
    running: dict[int, Any] = {}
    most, cap_then, over = 0, 0.0, 0
    for instant, step, row in events:  # an end sorts before a start at the same instant
        if step < 0:
            running.pop(id(row), None)
            continue
        running[id(row)] = row
        claimed = min(r.claimed for r in running.values())
        cap = _allowed(phases, claimed, instant, field)
        if len(running) > cap:
            over += 1
        if len(running) > most:
            most, cap_then = len(running), cap
    return most, cap_then, over


def most_per_key(rows: Sequence[Any], phases: Sequence[Limits]) -> tuple[int, float, int]:
    """:func:`most_running` per concurrency key against ``key_concurrency``: the worst key."""
    by_key: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_key[row.concurrency_key or ""].append(row)
    worst = (0, 0.0, 0)
    over = 0
    for same_key in by_key.values():
        most, cap, key_over = most_running(same_key, phases, "key_concurrency")
        over += key_over
        if most > worst[0]:
            worst = (most, cap, 0)
    return worst[0], worst[1], over


def most_claims_per_second(rows: Sequence[Any], phases: Sequence[Limits]) -> tuple[int, float, int]:
    """(most claims in any one-second window, the rate then, windows over the rate)."""
    claims = sorted(row.claimed for row in rows)
    most, rate_then, over = 0, 0.0, 0
    end = 0
    for index, first in enumerate(claims):
        while end < len(claims) and claims[end] < first + 1.0 - 1e-6:
            end += 1
        count = end - index
        rate = _allowed(phases, first, first + 1.0, "rate")
        if count > rate:
            over += 1
        if count > most:
            most, rate_then = count, rate
    return most, rate_then, over


def cap_text(most: int, cap: float) -> str:
    """``7 / 8``: the most at once and the cap then."""
    return f"{most} / {'none' if math.isinf(cap) else int(cap)}"


def table(rows: Mapping[str, Mapping[str, object]], first_column: str) -> str:
    """A markdown table of counts (cells printed as they are)."""
    columns = list(dict.fromkeys(name for cells in rows.values() for name in cells))
    lines = ["| " + " | ".join([first_column, *columns]) + " |", "|" + "---|" * (len(columns) + 1)]
    for label, cells in rows.items():
        lines.append(
            "| " + " | ".join([label, *(str(cells.get(name, "")) for name in columns)]) + " |"
        )
    return "\n".join(lines)
