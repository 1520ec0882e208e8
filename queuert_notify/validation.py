"""Argument checks shared by ``Client.start_chain`` and ``JobContext.continue_with``.

Everything here runs before any write: a rejected argument raises
:class:`~queuert_notify.errors.InvalidInputError` and leaves the database and
the notify transport untouched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from queuert_notify.errors import InvalidInputError
from state_adapters.protocol import NewChain, NewJob

MAX_TYPE_NAME_LENGTH = 200
MAX_DEDUP_KEY_LENGTH = 255
DEDUP_SCOPES = ("incomplete", "ever")


def check_type_name(type_name: object) -> str:
    """Return ``type_name`` if it is a non-empty string of sane length."""
    if not isinstance(type_name, str) or not type_name.strip():
        raise InvalidInputError(f"type_name must be a non-empty string, got {type_name!r}")
    if len(type_name) > MAX_TYPE_NAME_LENGTH:
        raise InvalidInputError(
            f"type_name is {len(type_name)} characters long; the limit is {MAX_TYPE_NAME_LENGTH}"
        )
    return type_name


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if it round-trips through strict JSON (no NaN/Infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"{what} must be JSON-serializable (dict, list, str, int, float, bool, None): {exc}"
        ) from None
    return value


def resolve_run_at(run_at: datetime | None, delay: float | None) -> datetime | None:
    """The instant a job becomes due: ``run_at`` (timezone-aware) or now + ``delay`` seconds."""
    if run_at is not None and delay is not None:
        raise InvalidInputError("pass either run_at or delay, not both")
    if delay is not None:
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise InvalidInputError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        return datetime.now(UTC) + timedelta(seconds=delay) if delay > 0 else None
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidInputError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidInputError(
                "run_at must be timezone-aware (e.g. datetime.now(UTC) + timedelta(...)); "
                "a naive datetime is ambiguous"
            )
        return run_at.astimezone(UTC)
    return None


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInputError(f"priority must be an int (lower runs first), got {priority!r}")
    return priority


def check_max_attempts(max_attempts: object) -> int | None:
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidInputError(f"max_attempts must be None or an int >= 1, got {max_attempts!r}")
    return max_attempts


def new_job(
    type_name: str,
    input: Any,
    *,
    run_at: datetime | None,
    delay: float | None,
    priority: int,
    max_attempts: int | None,
) -> NewJob:
    """A validated :class:`NewJob`."""
    return NewJob(
        type_name=check_type_name(type_name),
        input=check_json(input, "input"),
        run_at=resolve_run_at(run_at, delay),
        priority=check_priority(priority),
        max_attempts=check_max_attempts(max_attempts),
    )


def new_chain(
    job: NewJob,
    *,
    dedup_key: str | None,
    dedup_scope: str,
    dedup_window: float | None,
    blockers: Sequence[str],
) -> NewChain:
    """A validated :class:`NewChain` around an already validated first job."""
    if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
        raise InvalidInputError(f"dedup_key must be None or a non-empty string, got {dedup_key!r}")
    if dedup_key is not None and len(dedup_key) > MAX_DEDUP_KEY_LENGTH:
        raise InvalidInputError(
            f"dedup_key is {len(dedup_key)} characters long; the limit is {MAX_DEDUP_KEY_LENGTH}"
        )
    if dedup_scope not in DEDUP_SCOPES:
        raise InvalidInputError(f"dedup_scope must be one of {DEDUP_SCOPES}, got {dedup_scope!r}")
    if dedup_window is not None and (
        isinstance(dedup_window, bool)
        or not isinstance(dedup_window, int | float)
        or not math.isfinite(dedup_window)
        or dedup_window <= 0
    ):
        raise InvalidInputError(
            f"dedup_window must be None or a positive number of seconds, got {dedup_window!r}"
        )
    if isinstance(blockers, str):
        raise InvalidInputError("blockers must be a sequence of chain ids, not a single string")
    blocker_ids = list(blockers)
    for blocker in blocker_ids:
        if not isinstance(blocker, str) or not blocker:
            raise InvalidInputError(f"every blocker must be a chain id string, got {blocker!r}")
    return NewChain(
        job=job,
        dedup_key=dedup_key,
        dedup_scope=dedup_scope,  # type: ignore[arg-type]  # checked against DEDUP_SCOPES above
        dedup_window=float(dedup_window) if dedup_window is not None else None,
        blockers=tuple(dict.fromkeys(blocker_ids)),
    )
