"""Argument checks shared by ``Client.start_chain``, ``JobContext.continue_with``,
handler outputs and the state adapter.

Everything here runs before any write: a rejected argument raises
:class:`~queuert_notify.errors.InvalidInputError` and leaves the database and
the notify transport untouched. What passes is stored by every supported
database (Postgres and SQLite) and read back equal, so no value fails halfway
through a write or comes back changed:

- text and JSON as :mod:`state_adapters.storable` checks them;
- numbers stored in SQL ``INTEGER`` columns (priority, max_attempts) fit in
  32 bits; delays and windows are at most :data:`MAX_SECONDS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from state_adapters.errors import InvalidInputError
from state_adapters.model import Completion, ContinueWith, JobLogLine, NewChain, NewJob
from state_adapters.schema import ID_LENGTH, SCHEDULE_NAME_LENGTH
from state_adapters.storable import check_json, check_text

MAX_TYPE_NAME_LENGTH = 200
MAX_DEDUP_KEY_LENGTH = 255
MAX_TRACE_CONTEXT_LENGTH = 8192
"""Characters; W3C ``traceparent`` + ``tracestate`` + ``baggage`` fit with room to spare."""
DEDUP_SCOPES = ("incomplete", "ever")
_ID_DIGITS = "0123456789abcdef"
SQL_INT_MIN, SQL_INT_MAX = -(2**31), 2**31 - 1
"""Range of the SQL ``INTEGER`` columns priority and max_attempts."""
MAX_SECONDS = 1000 * 365 * 24 * 3600.0
"""Longest delay or dedup window (about 1000 years): far beyond any job's life, and
short enough that the instant it names is a valid datetime."""


def check_type_name(type_name: object) -> str:
    """Return ``type_name`` if it is a non-empty, storable string of sane length."""
    if not isinstance(type_name, str) or not type_name.strip():
        raise InvalidInputError(f"type_name must be a non-empty string, got {type_name!r}")
    if len(type_name) > MAX_TYPE_NAME_LENGTH:
        raise InvalidInputError(
            f"type_name is {len(type_name)} characters long; the limit is {MAX_TYPE_NAME_LENGTH}"
        )
    return check_text(type_name, "type_name")


def check_concurrency_key(key: object) -> str | None:
    """Return ``key`` if it is None or a non-empty, storable string of at most
    :data:`MAX_DEDUP_KEY_LENGTH` characters (as a dedup key)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"concurrency_key must be None or a non-empty string, got {key!r}")
    if len(key) > MAX_DEDUP_KEY_LENGTH:
        raise InvalidInputError(
            f"concurrency_key is {len(key)} characters long; the limit is {MAX_DEDUP_KEY_LENGTH}"
        )
    return check_text(key, "concurrency_key")


MAX_CONCURRENCY = 1_000_000
"""Largest ``concurrency`` or ``key_concurrency`` (far beyond any fleet of workers)."""
MAX_RATE = 100_000
"""Most starts a ``rate`` allows per window: the window's starts are kept in the
type's row, at most one entry per claim."""
MAX_RATE_WINDOW = 7 * 24 * 3600.0
"""Longest ``per`` window (a week)."""


def check_limit_count(value: object, what: str, highest: int) -> int | None:
    """Return ``value`` if it is None (no limit) or an int from 1 to ``highest``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= highest:
        raise InvalidInputError(
            f"{what} must be None (no limit) or an int from 1 to {highest}, got {value!r}"
        )
    return value


def window_seconds(per: object) -> float | None:
    """A rate limit's window ``per`` (a ``timedelta``, or ``None`` for none) in seconds."""
    if per is not None and not isinstance(per, timedelta):
        raise InvalidInputError(f"per must be a timedelta (or None), got {per!r}")
    return None if per is None else per.total_seconds()


def check_limits(
    concurrency: object, key_concurrency: object, rate: object, per_seconds: object
) -> tuple[int | None, int | None, int | None, float | None]:
    """The limits of one type, checked: counts from 1 to :data:`MAX_CONCURRENCY`, a
    ``rate`` of at most :data:`MAX_RATE` with a window ``per_seconds`` (> 0, at most
    :data:`MAX_RATE_WINDOW`), given together or not at all."""
    checked_rate = check_limit_count(rate, "rate", MAX_RATE)
    window: float | None = None
    if per_seconds is not None:
        window = check_seconds(per_seconds, "per", allow_zero=False)
        if window > MAX_RATE_WINDOW:
            raise InvalidInputError(
                f"per is {window!r} seconds; the limit is {MAX_RATE_WINDOW:.0f} (a week)"
            )
    if (checked_rate is None) != (window is None):
        raise InvalidInputError(
            "rate and per go together: pass both (e.g. rate=100, per=timedelta(seconds=1)) "
            "or neither"
        )
    return (
        check_limit_count(concurrency, "concurrency", MAX_CONCURRENCY),
        check_limit_count(key_concurrency, "key_concurrency", MAX_CONCURRENCY),
        checked_rate,
        window,
    )


def check_dedup_key(dedup_key: object) -> str | None:
    """Return ``dedup_key`` if it is None or a non-empty, storable string of at most
    :data:`MAX_DEDUP_KEY_LENGTH` characters."""
    if dedup_key is None:
        return None
    if not isinstance(dedup_key, str) or not dedup_key:
        raise InvalidInputError(f"dedup_key must be None or a non-empty string, got {dedup_key!r}")
    if len(dedup_key) > MAX_DEDUP_KEY_LENGTH:
        raise InvalidInputError(
            f"dedup_key is {len(dedup_key)} characters long; the limit is {MAX_DEDUP_KEY_LENGTH}"
        )
    return check_text(dedup_key, "dedup_key")


def check_seconds(value: object, what: str, *, allow_zero: bool) -> float:
    """Return ``value`` if it is a finite number of seconds, at most :data:`MAX_SECONDS`,
    and > 0 (or >= 0 with ``allow_zero``)."""
    lowest = ">= 0" if allow_zero else "> 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise InvalidInputError(
            f"{what} must be a finite number of seconds {lowest}, got {value!r}"
        )
    if value > MAX_SECONDS:
        raise InvalidInputError(
            f"{what} is {value!r} seconds; the limit is {MAX_SECONDS:.0f} (about 1000 years)"
        )
    return float(value)


def check_positive_int(value: object, what: str) -> int:
    """Return ``value`` if it is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInputError(f"{what} must be an int > 0, got {value!r}")
    return value


def check_aware(value: object, what: str) -> datetime:
    """Return ``value`` if it is a timezone-aware datetime (an instant), in UTC."""
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{what} must be timezone-aware (e.g. datetime.now(UTC)); a naive datetime is ambiguous"
        )
    return value.astimezone(UTC)


def check_schedule_name(name: object) -> str:
    """Return ``name`` if it is a non-empty, storable schedule name of at most
    :data:`~state_adapters.schema.SCHEDULE_NAME_LENGTH` characters."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"a schedule name must be a non-empty string, got {name!r}")
    if len(name) > SCHEDULE_NAME_LENGTH:
        raise InvalidInputError(
            f"schedule name {name[:40]!r}... is {len(name)} characters long; the limit is "
            f"{SCHEDULE_NAME_LENGTH}"
        )
    return check_text(name, "schedule name")


def resolve_run_at(run_at: datetime | None, delay: float | None) -> datetime | None:
    """The instant a job becomes due: ``run_at`` (timezone-aware) or now + ``delay`` seconds."""
    if run_at is not None and delay is not None:
        raise InvalidInputError("pass either run_at or delay, not both")
    if delay is not None:
        seconds = check_seconds(delay, "delay", allow_zero=True)
        return datetime.now(UTC) + timedelta(seconds=seconds) if seconds > 0 else None
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidInputError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidInputError(
                "run_at must be timezone-aware (e.g. datetime.now(UTC) + timedelta(...)); "
                "a naive datetime is ambiguous"
            )
        try:
            return run_at.astimezone(UTC)
        except OverflowError:
            raise InvalidInputError(f"run_at {run_at!r} is outside the years 1 to 9999") from None
    return None


def check_priority(priority: object) -> int:
    """Return ``priority`` if it is an int that fits the 32-bit SQL column."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not SQL_INT_MIN <= priority <= SQL_INT_MAX
    ):
        raise InvalidInputError(
            f"priority must be an int from {SQL_INT_MIN} to {SQL_INT_MAX} (lower runs first), "
            f"got {priority!r}"
        )
    return priority


def check_max_attempts(max_attempts: object) -> int | None:
    """Return ``max_attempts`` if it is None (unlimited) or an int from 1 to 2**31 - 1."""
    if max_attempts is None:
        return None
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= SQL_INT_MAX
    ):
        raise InvalidInputError(
            f"max_attempts must be None or an int from 1 to {SQL_INT_MAX}, got {max_attempts!r}"
        )
    return max_attempts


def new_job(
    type_name: str,
    input: Any,
    *,
    run_at: datetime | None,
    delay: float | None,
    priority: int,
    max_attempts: int | None,
    trace_context: str | None = None,
    concurrency_key: str | None = None,
) -> NewJob:
    """A validated :class:`NewJob` (a state adapter does not check it again)."""
    return NewJob(
        type_name=check_type_name(type_name),
        input=check_json(input, "input"),
        run_at=resolve_run_at(run_at, delay),
        priority=check_priority(priority),
        max_attempts=check_max_attempts(max_attempts),
        trace_context=check_trace_context(trace_context),
        concurrency_key=check_concurrency_key(concurrency_key),
        validated=True,
    )


def check_trace_context(trace_context: str | None) -> str | None:
    """Return ``trace_context`` if it is ``None`` or text a database stores, at most
    :data:`MAX_TRACE_CONTEXT_LENGTH` characters."""
    if trace_context is None:
        return None
    if not isinstance(trace_context, str) or len(trace_context) > MAX_TRACE_CONTEXT_LENGTH:
        raise InvalidInputError(
            f"trace_context must be None or a string of at most {MAX_TRACE_CONTEXT_LENGTH} "
            f"characters, got {type(trace_context).__name__} of {len(str(trace_context))}"
        )
    return check_text(trace_context, "trace_context")


def new_chain(
    job: NewJob,
    *,
    dedup_key: str | None,
    dedup_scope: str,
    dedup_window: float | None,
    blockers: Sequence[str],
    chain_id: str | None = None,
) -> NewChain:
    """A validated :class:`NewChain` around ``job``; ``chain_id`` (from
    :func:`state_adapters.ids.new_id`) fixes its id, ``None`` leaves it to the state
    adapter."""
    if isinstance(blockers, str):
        raise InvalidInputError("blockers must be a sequence of chain ids, not one string")
    # Most chains have none (the default, an empty tuple): no dict to build.
    unique_blockers = (
        () if isinstance(blockers, tuple) and not blockers else tuple(dict.fromkeys(blockers))
    )
    check_new_job(job)
    _check_chain_options(chain_id, dedup_key, dedup_scope, dedup_window, unique_blockers)
    # Built once, marked validated: a copy by ``dataclasses.replace`` was half the time
    # of this function (a batch of starts builds one per chain).
    return NewChain(
        job=job,
        dedup_key=dedup_key,
        dedup_scope=dedup_scope,  # type: ignore[arg-type]  # checked above
        dedup_window=dedup_window,
        blockers=unique_blockers,
        id=chain_id,
        validated=True,
    )


def completion(
    job_id: str, lease_token: str, result: Any, log_lines: Sequence[JobLogLine] = ()
) -> Completion:
    """A validated :class:`Completion` of a handler's ``result``: its output (JSON), or
    the ``ContinueWith`` it returned; with the attempt's last ``log_lines``."""
    if isinstance(result, ContinueWith):
        check_new_job(result.job)
        return Completion(
            job_id, lease_token, continue_with=result, log_lines=log_lines, validated=True
        )
    check_json(result, "the handler's output")
    return Completion(job_id, lease_token, output=result, log_lines=log_lines, validated=True)


def check_new_job(job: object) -> None:
    """Raise ``InvalidInputError`` unless ``job`` is a writable :class:`NewJob`."""
    if not isinstance(job, NewJob):
        raise InvalidInputError(f"expected a NewJob, got {type(job).__name__}")
    if job.validated:
        return
    check_type_name(job.type_name)
    check_json(job.input, "input")
    check_priority(job.priority)
    check_max_attempts(job.max_attempts)
    check_trace_context(job.trace_context)
    check_concurrency_key(job.concurrency_key)
    if job.run_at is not None and (
        not isinstance(job.run_at, datetime) or job.run_at.utcoffset() is None
    ):
        raise InvalidInputError("run_at must be a timezone-aware datetime (or None for now)")


def is_id(value: object) -> bool:
    """Whether ``value`` has the form of :func:`~state_adapters.ids.new_id`'s ids."""
    # Stripping the digits leaves nothing only if every character is one of them: two
    # thirds of the time of a regular expression's fullmatch, once per chain of a batch.
    return isinstance(value, str) and len(value) == ID_LENGTH and not value.strip(_ID_DIGITS)


def check_new_chain(chain: object) -> None:
    """Raise ``InvalidInputError`` unless ``chain`` is a writable :class:`NewChain`."""
    if not isinstance(chain, NewChain):
        raise InvalidInputError(f"expected a NewChain, got {type(chain).__name__}")
    if chain.validated:
        return
    check_new_job(chain.job)
    _check_chain_options(
        chain.id, chain.dedup_key, chain.dedup_scope, chain.dedup_window, chain.blockers
    )


def _check_chain_options(
    chain_id: object,
    dedup_key: object,
    dedup_scope: object,
    dedup_window: object,
    blockers: Sequence[object],
) -> None:
    """Raise ``InvalidInputError`` unless a new chain's options (all but its job) can
    be written."""
    if chain_id is not None and not is_id(chain_id):
        raise InvalidInputError(
            f"a new chain's id must be None or {ID_LENGTH} lowercase hex digits from "
            f"state_adapters.ids.new_id() (ids are time-ordered), got {chain_id!r}"
        )
    check_dedup_key(dedup_key)
    if dedup_scope not in DEDUP_SCOPES:
        raise InvalidInputError(f"dedup_scope must be one of {DEDUP_SCOPES}, got {dedup_scope!r}")
    if dedup_window is not None:
        check_seconds(dedup_window, "dedup_window", allow_zero=False)
    if isinstance(blockers, str):
        raise InvalidInputError("blockers must be a sequence of chain ids, not one string")
    for blocker in blockers:
        if not isinstance(blocker, str) or not blocker:
            raise InvalidInputError(f"every blocker must be a chain id string, got {blocker!r}")
        check_text(blocker, "a blocker chain id")


def check_completions(completions: Sequence[Completion]) -> None:
    """Raise ``InvalidInputError`` unless every completion can be written."""
    for done in completions:
        if done.validated:
            continue
        if done.continue_with is not None:
            check_new_job(done.continue_with.job)
        else:
            check_json(done.output, "output")
