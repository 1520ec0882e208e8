"""Periodic jobs: a :class:`Schedule` says when, the worker's :class:`Scheduler` starts them.

Exactly one chain per tick, with no leader: every worker that carries a schedule tries
to take each tick, and the state adapter lets exactly one of them take it, recording
the tick and starting its chain in one transaction (see
:mod:`state_adapters.steps.schedule_ticks`). A schedule's last tick only moves forward, so
after downtime the latest missed tick runs once (not one run per missed tick), and a
worker whose clock lags never runs a tick again. Ticks fall due on the database's clock,
not the worker's. A schedule removed from the code is
no longer fired by anyone; its row stays, unused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from queuert_notify.client.client import Client
from queuert_notify.errors import ConfigurationError, InvalidInputError
from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS
from state_adapters.model import NewChain, StartedChain
from state_adapters.notifications import NotificationBuffer
from state_adapters.outage_log import OutageLog
from state_adapters.storable import check_json
from state_adapters.validation import (
    check_schedule_name,
    check_type_name,
    new_chain,
    new_job,
)

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RECHECK = 60.0
"""Longest sleep between looks at the clock, so a clock that jumps is noticed."""
_RETRY = 2.0
"""Seconds before a tick that could not be taken (the database failed) is tried again."""
TICK_KEY = "tick"
"""The key of the job's input that holds the tick (ISO 8601, in the schedule's zone)."""


class Schedule:
    """Start a chain of ``type_name`` at every tick of ``cron`` or ``every``.

    - ``cron``: a five-field cron expression (``"0 3 * * *"``), read by the
      ``cronsim`` library (extra ``cron``) in ``timezone`` (an IANA name, default
      ``"UTC"``). Across a DST change a tick in the skipped hour runs once when the
      clock jumps, and a tick in the repeated hour runs once, at its first occurrence.
    - ``every``: a positive ``timedelta``; ticks are the whole multiples of it since the
      Unix epoch in UTC, so every process agrees on them (``timezone`` is not used).

    The job's input is ``input`` (a JSON object, default ``{}``) with the tick added
    under ``"tick"``, e.g. ``{"tick": "2026-11-25T03:00:00+01:00", ...}``. The chain's
    dedup key is ``schedule:{name}@{tick in UTC, ISO 8601}``, with scope ``"ever"``.
    Names are unique per database: two schedules (in any process) with one name share
    their ticks. Invalid arguments raise ``InvalidInputError`` here.
    """

    __slots__ = ("_zone", "cron", "every", "input", "max_attempts", "name", "timezone", "type_name")

    def __init__(
        self,
        name: str,
        type_name: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str | None = None,
        input: Mapping[str, Any] | None = None,
        max_attempts: int | None = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.name = check_schedule_name(name)
        self.type_name = check_type_name(type_name)
        if (cron is None) == (every is None):
            raise InvalidInputError(
                f"schedule {name!r}: pass exactly one of cron='* * * * *' or every=timedelta(...)"
            )
        self.cron = cron
        self.every = every
        self.timezone = timezone
        self._zone: tzinfo = UTC
        if every is not None:
            if not isinstance(every, timedelta) or every <= timedelta(0):
                raise InvalidInputError(
                    f"schedule {name!r}: every must be a positive timedelta, got {every!r}"
                )
            if timezone is not None:
                raise InvalidInputError(
                    f"schedule {name!r}: timezone applies to cron schedules only; every= "
                    "ticks are multiples of the interval since the Unix epoch in UTC"
                )
        else:
            self._zone = _zone(name, timezone or "UTC")
            _check_cron(name, cron)
        if input is None:
            input = {}
        if not isinstance(input, Mapping):
            raise InvalidInputError(
                f"schedule {name!r}: input must be a JSON object (a dict), got "
                f"{type(input).__name__}"
            )
        if TICK_KEY in input:
            raise InvalidInputError(
                f"schedule {name!r}: input may not have the key {TICK_KEY!r}: the tick goes there"
            )
        self.input: dict[str, Any] = json.loads(json.dumps(check_json(dict(input), "input")))
        self.max_attempts = max_attempts
        # Fails here, not at the first tick, for a bad type_name or max_attempts.
        self.new_chain(_EPOCH)

    def __repr__(self) -> str:
        when = f"cron={self.cron!r}, timezone={self.timezone or 'UTC'!r}"
        if self.every is not None:
            when = f"every={self.every!r}"
        return f"Schedule({self.name!r}, {self.type_name!r}, {when})"

    @property
    def cadence(self) -> str:
        """How often, for people: ``"0 3 * * * (Europe/Berlin)"`` or ``"every 0:00:30"``."""
        if self.every is not None:
            return f"every {self.every}"
        return f"{self.cron} ({self.timezone or 'UTC'})"

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``, in UTC."""
        if self.every is not None:
            return _EPOCH + ((now - _EPOCH) // self.every) * self.every
        from cronsim import CronSim

        # cronsim is exclusive of its start and counts whole minutes: a microsecond
        # after now makes a tick at exactly now count.
        local = (now + timedelta(microseconds=1)).astimezone(self._zone)
        return next(CronSim(self._cron, local, reverse=True)).astimezone(UTC)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick after ``after``, in UTC."""
        if self.every is not None:
            return self.latest_tick(after) + self.every
        from cronsim import CronSim

        return next(CronSim(self._cron, after.astimezone(self._zone))).astimezone(UTC)

    def dedup_key(self, tick: datetime) -> str:
        """``schedule:{name}@{tick in UTC, ISO 8601}``."""
        return f"schedule:{self.name}@{tick.astimezone(UTC).isoformat()}"

    def new_chain(self, tick: datetime) -> NewChain:
        """The chain of ``tick``: the schedule's input with the tick added."""
        job = new_job(
            self.type_name,
            {**self.input, TICK_KEY: tick.astimezone(self._zone).isoformat()},
            run_at=None,
            delay=None,
            priority=0,
            max_attempts=self.max_attempts,
        )
        return new_chain(
            job,
            dedup_key=self.dedup_key(tick),
            dedup_scope="ever",
            dedup_window=None,
            blockers=(),
        )

    @property
    def _cron(self) -> str:
        assert self.cron is not None
        return self.cron


def check_schedules(schedules: Sequence[Schedule]) -> list[Schedule]:
    """``schedules`` as a list, if they are Schedules with distinct names."""
    if isinstance(schedules, Schedule) or not isinstance(schedules, Sequence):
        raise InvalidInputError("schedules must be a list of Schedule")
    names: set[str] = set()
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise InvalidInputError(f"schedules must be Schedule objects, got {schedule!r}")
        if schedule.name in names:
            raise InvalidInputError(f"two schedules are named {schedule.name!r}")
        names.add(schedule.name)
    return list(schedules)


class Scheduler:
    """Starts each schedule's chain at its ticks, on a timer of its own (owned by the
    worker, like the reaper). Leaderless: each tick is taken by compare-and-set in the
    database, so any number of schedulers start one chain per tick.

    At start, a schedule the database has never seen is registered at its latest past
    tick without running it (it first runs at its next tick); a schedule whose last
    tick is older than its latest past tick runs that tick once (catch-up)."""

    def __init__(self, client: Client, schedules: Sequence[Schedule], *, worker_id: str) -> None:
        self._client = client
        self._schedules = list(schedules)
        self._worker_id = worker_id
        self._last: dict[str, datetime] = {}
        self._registered = False
        self._outage = OutageLog(logger, "starting scheduled chains")

    async def run(self) -> None:
        """Fire ticks until cancelled. What is due is decided on the database's clock
        (``state.database_time()``, read once per pass), so a worker whose clock runs
        ahead takes no tick early, and one whose clock lags holds none back; only the
        length of a sleep is measured on this process's clock."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                now = await self._client.state.database_time()
                read_at = loop.time()
                if not self._registered:
                    await self._register(now)
                for schedule in self._schedules:
                    await self._fire_due(schedule, now)
            except ConfigurationError:
                delay = _RETRY  # the worker's loop stops the worker with this error
            except Exception:
                self._outage.failed("retrying shortly", worker_id=self._worker_id)
                delay = _RETRY * random.uniform(0.5, 1.5)
            else:
                self._outage.succeeded()
                delay = max(self._until_next_tick(now) - (loop.time() - read_at), 0.001)
            await asyncio.sleep(delay)

    async def _register(self, now: datetime) -> None:
        state = self._client.state
        names = [s.name for s in self._schedules]
        known = await state.schedule_ticks(names)
        for schedule in self._schedules:
            if schedule.name not in known:
                tick = schedule.latest_tick(now)
                await state.take_schedule_tick(
                    schedule.name, tick, None, notes=NotificationBuffer()
                )
        self._last = dict(await state.schedule_ticks(names))
        self._registered = True

    async def _fire_due(self, schedule: Schedule, now: datetime) -> None:
        tick = schedule.latest_tick(now)
        last = self._last.get(schedule.name)
        if last is not None and tick <= last:
            return
        notes = NotificationBuffer()
        started = await self._client.state.take_schedule_tick(
            schedule.name, tick, schedule.new_chain(tick), notes=notes
        )
        # Taken by this worker or another: either way this tick is done.
        self._last[schedule.name] = tick
        if started is not None:
            await self._client.flush(notes)
            _log_started(schedule, tick, started, self._worker_id)

    def _until_next_tick(self, now: datetime) -> float:
        if not self._schedules:
            return _RECHECK
        soonest = min(s.next_tick(now) for s in self._schedules)
        return min(max((soonest - now).total_seconds(), 0.001), _RECHECK)


def _log_started(schedule: Schedule, tick: datetime, started: StartedChain, worker_id: str) -> None:
    logger.info(
        "schedule started a chain",
        extra={
            "schedule": schedule.name,
            "tick": tick.isoformat(),
            "chain_id": started.id,
            "type_name": schedule.type_name,
            "worker_id": worker_id,
        },
    )


def _zone(name: str, timezone: str) -> tzinfo:
    if not isinstance(timezone, str):
        raise InvalidInputError(
            f"schedule {name!r}: timezone must be an IANA name such as 'Europe/Berlin', got "
            f"{timezone!r}"
        )
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError(
            f"schedule {name!r}: unknown timezone {timezone!r}; use an IANA name such as "
            "'Europe/Berlin' (on a system without tz data, pip install tzdata)"
        ) from None


def _check_cron(name: str, cron: object) -> None:
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise ConfigurationError(
            f"schedule {name!r}: cron schedules need the cronsim library: "
            "pip install 'queuert-notify[cron]'"
        ) from None
    if not isinstance(cron, str):
        raise InvalidInputError(f"schedule {name!r}: cron must be a string, got {cron!r}")
    try:
        next(CronSim(cron, datetime.now(UTC)))
    except (CronSimError, StopIteration) as exc:
        raise InvalidInputError(
            f"schedule {name!r}: cron expression {cron!r} is invalid ({exc}); expected five "
            "fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * *'"
        ) from None
