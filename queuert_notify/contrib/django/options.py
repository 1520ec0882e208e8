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
==================  ===========================================================  ==========
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from queuert_notify.errors import ConfigurationError
from state_adapters.backoff import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_MAX_ATTEMPTS
from state_adapters.schema import DEFAULT_TABLE_PREFIX

_KNOWN = {
    "redis_url",
    "redis_prefix",
    "table_prefix",
    "database",
    "max_attempts",
    "backoff_base",
    "backoff_cap",
    "poll_interval",
}


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

    @classmethod
    def parse(cls, alias: str, options: Mapping[str, Any]) -> BackendOptions:
        unknown = sorted(set(options) - _KNOWN)
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_KNOWN))}"
            )
        parsed = cls(**options)
        if parsed.max_attempts is not None and (
            not isinstance(parsed.max_attempts, int) or parsed.max_attempts < 1
        ):
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS']['max_attempts'] must be None or an int >= 1, "
                f"got {parsed.max_attempts!r}"
            )
        return parsed
