"""What each page of the dashboard shows, read through the ``StateAdapter`` protocol
only, and what the page watches for live updates.

A page is a :class:`View`: a template, its context, and a :class:`Watch` naming the
chains and job types whose notifications may change it (see ``live.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from state_adapters.errors import ChainNotFoundError, InvalidInputError
from state_adapters.health import DEFAULT_HORIZON_AGE, HealthThresholds, duration, size
from state_adapters.model import (
    ALL_STATUSES,
    FINAL_STATUSES,
    UNFINISHED_STATUSES,
    ChainRecord,
    JobLogLine,
    JobRecord,
    QueueOverview,
    known_types,
    unhandled_line,
    unhandled_types,
)
from state_adapters.protocol import StateAdapter

WINDOW = timedelta(hours=1)
"""The overview's throughput window."""
FINISHED_LIMIT = 10_000
"""Finished jobs the overview counts at most in :data:`WINDOW` (see ``QueueOverview``):
bounds the page's cost on a queue that finishes more than that per hour."""
PAGE_SIZE = 50
CHAIN_JOBS_SHOWN = 200
"""A chain page shows its first this many jobs and its last one."""
LOGGED_JOBS_SHOWN = 20
"""A chain page shows the log lines of its last this many jobs shown."""
FINISHED_STATUSES: tuple[str, ...] = tuple(s for s in ALL_STATUSES if s in FINAL_STATUSES)


@dataclass(frozen=True, slots=True)
class Watch:
    """Notifications that may change a page: chains completing, jobs of these types
    being scheduled."""

    chain_ids: frozenset[str] = frozenset()
    type_names: frozenset[str] = frozenset()
    running: bool = False
    """A job on the page runs: its log lines arrive unannounced, re-read often."""


@dataclass(slots=True)
class View:
    """A page to render: ``template`` with ``context``; ``watch`` for live updates."""

    template: str
    context: dict[str, Any]
    watch: Watch = field(default_factory=Watch)
    status_code: int = 200


class Pages:
    """The dashboard's pages over one state adapter."""

    def __init__(self, state: StateAdapter) -> None:
        self.state = state

    async def overview(self) -> View:
        """Jobs by type and status, the last hour's throughput and failures."""
        now = datetime.now(UTC)
        overview = await self.state.queue_overview(
            since=now - WINDOW, finished_limit=FINISHED_LIMIT
        )
        controls = await self.state.type_controls()
        paused = sorted(c.type_name for c in controls if c.paused)
        workers = await self.state.workers()
        unhandled = unhandled_types(await self.state.due_jobs_by_type(), workers, now)
        known = known_types(workers, now)
        rows = [
            {
                "type_name": type_name,
                "unfinished": [
                    overview.unfinished.get(type_name, {}).get(s, 0) for s in UNFINISHED_STATUSES
                ],
                "finished": [
                    overview.finished.get(type_name, {}).get(s, 0) for s in FINISHED_STATUSES
                ],
            }
            for type_name in overview.type_names
        ]
        # Truncated, the counts cover the minutes since the oldest job counted: the rate
        # is over those minutes, not the hour.
        counted_since = now - WINDOW
        if overview.truncated and overview.minutes:
            counted_since = overview.minutes[0].start
        counted_minutes = max(1.0, (now - counted_since).total_seconds() / 60)
        totals = {
            s: sum(c.get(s, 0) for c in overview.finished.values()) for s in FINISHED_STATUSES
        }
        context = {
            "rows": rows,
            "unfinished_statuses": UNFINISHED_STATUSES,
            "finished_statuses": FINISHED_STATUSES,
            "totals": totals,
            "truncated": overview.truncated,
            "counted_since": counted_since,
            "finished_limit": FINISHED_LIMIT,
            "chart": activity_chart(overview, now),
            "per_minute": round(totals["completed"] / counted_minutes, 1),
            "paused_types": paused,
            "limits": [c for c in controls if c.limited],
            "workers": [(worker, worker.alive(now)) for worker in workers],
            "unhandled": [unhandled_line(t, n, known) for t, n in unhandled.items()],
        }
        return View("overview.html", context, Watch(type_names=frozenset(overview.type_names)))

    async def chains(self, params: Mapping[str, str]) -> View:
        """Chains newest first, filtered by status, type and id or deduplication key."""
        status = params.get("status") or None
        type_name = params.get("type") or None
        search = (params.get("q") or "").strip() or None
        after = params.get("after") or None
        filters = {"status": status or "", "type": type_name or "", "q": search or ""}
        if status is not None and status not in ALL_STATUSES:
            raise InvalidInputError(f"status must be one of {', '.join(ALL_STATUSES)}")
        page = await self.state.find_chains(
            status=status,
            type_name=type_name,
            search=search,
            limit=PAGE_SIZE,
            after=after,
        )
        chains: list[ChainRecord] = list(page.items)
        context = {
            "chains": chains,
            "filters": filters,
            "statuses": ALL_STATUSES,
            "next_cursor": page.next_cursor,
            "paged": after is not None,
        }
        watch = Watch(
            chain_ids=frozenset(c.id for c in chains if c.status not in FINAL_STATUSES),
            type_names=frozenset({c.last_job.type_name for c in chains} | _types(type_name)),
        )
        return View("chains.html", context, watch)

    async def chain(self, chain_id: str) -> View:
        """One chain: its jobs, attempts, errors, data, blockers and dependents."""
        try:
            chain = await self.state.get_chain(chain_id)
        except ChainNotFoundError:
            return View("missing.html", {"chain_id": chain_id}, status_code=404)
        page = await self.state.list_jobs(chain_id=chain_id, limit=CHAIN_JOBS_SHOWN)
        jobs: list[JobRecord] = list(page.items)
        if page.next_cursor is not None and jobs[-1].id != chain.last_job.id:
            jobs.append(chain.last_job)  # the jobs in between are left out (see the page)
        links = await self.state.chain_links(chain_id)
        linked = {
            c.id: c for c in await self.state.get_chains([*links.blocked_by, *links.blocking])
        }
        last = chain.last_job
        now = datetime.now(UTC)
        views = [_job_view(job) for job in jobs]
        for view in views[-LOGGED_JOBS_SHOWN:]:
            view["attempts"] = _attempts(await self.state.job_logs(view["job"].id))
        context = {
            "chain": chain,
            "jobs": views,
            "jobs_left_out": chain.last_job.chain_index + 1 - len(jobs),
            "last": _job_view(last),
            "blocked_by": [linked.get(i) or i for i in links.blocked_by],
            "blocking": [linked.get(i) or i for i in links.blocking],
            "can_cancel": chain.status not in FINAL_STATUSES,
            "can_retry": chain.status in ("failed", "cancelled"),
            "can_trigger": last.status == "pending" and last.scheduled_at > now,
        }
        watch = Watch(
            chain_ids=frozenset() if chain.status in FINAL_STATUSES else frozenset({chain.id}),
            type_names=frozenset(job.type_name for job in jobs),
            running=last.status == "running",
        )
        return View("chain.html", context, watch)

    async def health(self, params: Mapping[str, str]) -> View:
        """The health report (see ``Client.health``): findings, what holds back vacuum,
        the queue tables; re-read on the page's refresh. ``?horizon_age=`` (seconds) sets
        the age from which a transaction is a finding."""
        thresholds = HealthThresholds(horizon_age=_seconds(params.get("horizon_age")))
        report = await self.state.health(thresholds=thresholds)
        context = {
            "report": report,
            "duration": duration,
            "size": size,
            "horizon_age": thresholds.horizon_age,
        }
        return View("health.html", context)


def _seconds(text: str | None) -> float:
    if not text:
        return DEFAULT_HORIZON_AGE
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise InvalidInputError(f"horizon_age must be a number of seconds >= 0, got {text!r}")
    return seconds


def _types(type_name: str | None) -> set[str]:
    return set() if type_name is None else {type_name}


def _job_view(job: JobRecord) -> dict[str, Any]:
    return {
        "job": job,
        "input": pretty_json(job.input),
        "output": pretty_json(job.output),
        "progress": None if job.progress is None else pretty_json(job.progress),
        "attempts": [],
    }


def _attempts(lines: list[JobLogLine]) -> list[dict[str, Any]]:
    """A job's log lines by attempt, as text for the template (which escapes it)."""
    attempts: dict[int, list[dict[str, str]]] = {}
    for line in lines:
        fields = " ".join(
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (line.fields or {}).items()
        )
        attempts.setdefault(line.attempt, []).append(
            {
                "at": line.at.strftime("%H:%M:%S.%f")[:-3],
                "level": line.level,
                "message": line.message,
                "fields": fields,
            }
        )
    return [{"attempt": n, "lines": shown} for n, shown in attempts.items()]


def pretty_json(value: Any) -> str:
    """A stored JSON value as indented text (escaped by the template, never trusted)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def activity_chart(overview: QueueOverview, now: datetime) -> list[dict[str, Any]]:
    """One bar per minute of the window (oldest first): heights in percent of the
    busiest minute, and the counts for the bar's title."""
    by_minute = {m.start: m for m in overview.minutes}
    first = (now - WINDOW).replace(second=0, microsecond=0) + timedelta(minutes=1)
    bars: list[dict[str, Any]] = []
    for step in range(int(WINDOW.total_seconds() // 60)):
        start = first + timedelta(minutes=step)
        minute = by_minute.get(start)
        bars.append(
            {
                "start": start,
                "completed": minute.completed if minute else 0,
                "failed": (minute.failed + minute.cancelled) if minute else 0,
            }
        )
    busiest: int = max((b["completed"] + b["failed"] for b in bars), default=0) or 1
    for bar in bars:
        bar["completed_pct"] = round(100 * int(bar["completed"]) / busiest, 1)
        bar["failed_pct"] = round(100 * int(bar["failed"]) / busiest, 1)
    return bars
