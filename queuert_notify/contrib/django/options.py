"""The backend's ``OPTIONS`` (``settings.TASKS[alias]["OPTIONS"]``), checked once.

==================  ===========================================================  ==========
option              meaning                                                      default
==================  ===========================================================  ==========
``redis_url``       Redis server the wakeups are published to (``None``:        ``None``
                    workers find jobs on their poll)
``redis_prefix``    the Redis key/channel prefix, as ``RedisNotifyAdapter``'s    ``queuert``
``table_prefix``    the queue's tables (``{prefix}jobs``, ...)                   ``queuert_``
``database``        the ``DATABASES`` alias jobs are written to and read from    ``default``
``max_attempts``    attempts a task gets before it is ``FAILED`` (``None``:       20
                    retry forever)
``backoff_base``    seconds before the first retry; doubles per attempt          1.0
``backoff_cap``     no retry waits longer than this (seconds)                    3600.0
``poll_interval``   seconds a worker waits between polls without a wakeup        60.0
``limits``          ``{queue: {"concurrency", "key_concurrency", "rate",         ``{}``
                    "per"}}``: set on every worker start (``per`` in seconds
                    or a ``timedelta``)
``paused``          queues paused on every worker start                          ``[]``
``schedules``       ``{name: {"task": "app.tasks.fn", "cron": "0 3 * * *" or     ``{}``
                    "every": seconds, "timezone", "args", "kwargs"}}``
==================  ===========================================================  ==========

Everything is checked here, when the backend is made (a ``ConfigurationError`` naming
the option); what needs the project's code (a schedule's task) is checked by the
backend's system check and by ``queuert_worker`` as it starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from queuert_notify.errors import ConfigurationError, InvalidInputError
from queuert_notify.maintenance.schedules import Schedule
from state_adapters.backoff import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_MAX_ATTEMPTS
from state_adapters.schema import DEFAULT_TABLE_PREFIX
from state_adapters.validation import check_limits

_KNOWN = {
    "redis_url",
    "redis_prefix",
    "table_prefix",
    "database",
    "max_attempts",
    "backoff_base",
    "backoff_cap",
    "poll_interval",
    "limits",
    "paused",
    "schedules",
}
_LIMIT_KEYS = {"concurrency", "key_concurrency", "rate", "per"}
_SCHEDULE_KEYS = {"task", "cron", "every", "timezone", "args", "kwargs"}


@dataclass(frozen=True)
class QueueLimits:
    """One queue's limits (``None`` lifts one), as ``Client.set_limits`` takes them."""

    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: int | None = None
    per: timedelta | None = None


@dataclass(frozen=True)
class TaskSchedule:
    """A schedule of ``OPTIONS["schedules"]``: ``task`` (its module path) is enqueued
    with ``args``/``kwargs`` at every tick of ``cron`` (in ``timezone``) or ``every``."""

    name: str
    task: str
    cron: str | None = None
    every: timedelta | None = None
    timezone: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendOptions:
    """One backend's settings; a typo or a bad value is a ``ConfigurationError``."""

    redis_url: str | None = None
    redis_prefix: str = "queuert"
    table_prefix: str = DEFAULT_TABLE_PREFIX
    database: str = "default"
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    poll_interval: float = 60.0
    limits: Mapping[str, QueueLimits] = field(default_factory=dict)
    paused: tuple[str, ...] = ()
    schedules: tuple[TaskSchedule, ...] = ()

    @classmethod
    def parse(cls, alias: str, options: Mapping[str, Any]) -> BackendOptions:
        where = f"TASKS[{alias!r}]['OPTIONS']"
        unknown = sorted(set(options) - _KNOWN)
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_KNOWN))}"
            )
        plain = {k: v for k, v in options.items() if k not in {"limits", "paused", "schedules"}}
        parsed = cls(
            **plain,
            limits=_limits(where, options.get("limits") or {}),
            paused=_paused(where, options.get("paused") or ()),
            schedules=_schedules(where, options.get("schedules") or {}),
        )
        if parsed.max_attempts is not None and (
            not isinstance(parsed.max_attempts, int) or parsed.max_attempts < 1
        ):
            raise ConfigurationError(
                f"{where}['max_attempts'] must be None or an int >= 1, got {parsed.max_attempts!r}"
            )
        return parsed


def _entries(
    where: str, option: str, given: object, what: str, keys: set[str]
) -> Iterator[tuple[Any, str, Mapping[str, Any]]]:
    """Each ``(name, where it stands, values)`` of ``OPTIONS[option]``: a dict of
    ``what`` whose values are dicts with keys among ``keys``."""
    if not isinstance(given, Mapping):
        raise ConfigurationError(f"{where}['{option}'] must be a dict of {what}, got {given!r}")
    for name, values in given.items():
        here = f"{where}['{option}'][{name!r}]"
        if not isinstance(values, Mapping) or not set(values) <= keys:
            raise ConfigurationError(
                f"{here} must be a dict with keys among {', '.join(sorted(keys))}, got {values!r}"
            )
        yield name, here, values


def _limits(where: str, given: object) -> dict[str, QueueLimits]:
    limits: dict[str, QueueLimits] = {}
    for queue, here, values in _entries(
        where, "limits", given, "queue name -> limits", _LIMIT_KEYS
    ):
        per = _seconds(here, "per", values.get("per"))
        try:
            check_limits(
                values.get("concurrency"),
                values.get("key_concurrency"),
                values.get("rate"),
                None if per is None else per.total_seconds(),
            )
        except InvalidInputError as exc:
            raise ConfigurationError(f"{here}: {exc}") from None
        limits[str(queue)] = QueueLimits(
            concurrency=values.get("concurrency"),
            key_concurrency=values.get("key_concurrency"),
            rate=values.get("rate"),
            per=per,
        )
    return limits


def _paused(where: str, given: object) -> tuple[str, ...]:
    if isinstance(given, str) or not isinstance(given, list | tuple | set | frozenset):
        raise ConfigurationError(f"{where}['paused'] must be a list of queue names, got {given!r}")
    if not all(isinstance(queue, str) and queue for queue in given):
        raise ConfigurationError(f"{where}['paused'] must hold queue names, got {given!r}")
    return tuple(sorted(given))


def _schedules(where: str, given: object) -> tuple[TaskSchedule, ...]:
    schedules = []
    for name, here, values in _entries(
        where, "schedules", given, "schedule name -> schedule", _SCHEDULE_KEYS
    ):
        task = values.get("task")
        if not isinstance(task, str) or "." not in task:
            raise ConfigurationError(
                f"{here}['task'] must be the task's module path ('app.tasks.fn'), got {task!r}"
            )
        args = values.get("args", ())
        kwargs = values.get("kwargs", {})
        if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
            raise ConfigurationError(f"{here}: args must be a list and kwargs a dict")
        schedule = TaskSchedule(
            name=name,
            task=task,
            cron=values.get("cron"),
            every=_seconds(here, "every", values.get("every")),
            timezone=values.get("timezone"),
            args=tuple(args),
            kwargs=dict(kwargs),
        )
        try:
            # Every check the queue makes of a schedule but the task's: cron, zone, JSON.
            as_queue_schedule(schedule, "django:-", {"args": list(args), "kwargs": kwargs}, 1)
        except (InvalidInputError, ConfigurationError) as exc:
            raise ConfigurationError(f"{here}: {exc}") from None
        schedules.append(schedule)
    return tuple(schedules)


def as_queue_schedule(
    schedule: TaskSchedule, type_name: str, input: Mapping[str, Any], max_attempts: int | None
) -> Schedule:
    """The queue's ``Schedule`` starting jobs of ``type_name`` with ``input``."""
    return Schedule(
        schedule.name,
        type_name,
        cron=schedule.cron,
        every=schedule.every,
        timezone=schedule.timezone,
        input=input,
        max_attempts=max_attempts,
    )


def _seconds(where: str, key: str, value: object) -> timedelta | None:
    """``value`` (seconds, or a ``timedelta``) as a ``timedelta``."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return timedelta(seconds=value)
    raise ConfigurationError(
        f"{where}['{key}'] must be a positive number of seconds or a timedelta, got {value!r}"
    )
