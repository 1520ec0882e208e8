"""Checks of the arguments that select rows or steer a call — ids, type names, cursors,
page sizes, statuses, worker ids — made before a statement runs, so a bad one is an
``InvalidInputError`` naming it rather than a driver error halfway through a call.
(Values to be stored are checked by :mod:`state_adapters.validation`.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from state_adapters.errors import InvalidInputError
from state_adapters.model import ALL_STATUSES, NewChain
from state_adapters.schema import WORKER_ID_LENGTH
from state_adapters.storable import check_text
from state_adapters.validation import check_type_name, is_id

MAX_PAGE_SIZE = 10_000


def check_type_names(type_names: Sequence[str]) -> list[str]:
    if isinstance(type_names, str):
        raise InvalidInputError("type_names must be a sequence of type names, not one string")
    return [check_type_name(name) for name in dict.fromkeys(type_names)]


def check_distinct_ids(chains: Sequence[NewChain]) -> None:
    given = [chain.id for chain in chains if chain.id is not None]
    if len(set(given)) != len(given):
        raise InvalidInputError("two chains of one start_chains batch have the same id")


def check_key(value: Any, what: str) -> str:
    """An id or name that selects rows: a string Postgres can compare (no NUL, no lone
    surrogate), refused here rather than by the driver halfway through a call."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {value!r}")
    return check_text(value, what)


def check_optional_key(value: Any, what: str) -> None:
    if value is not None:
        check_key(value, what)


def check_worker_id(worker_id: Any) -> None:
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > WORKER_ID_LENGTH:
        raise InvalidInputError(
            f"worker_id must be a non-empty string of at most {WORKER_ID_LENGTH} characters"
        )


def check_status(status: Any) -> None:
    if status is not None and status not in ALL_STATUSES:
        raise InvalidInputError(f"status must be one of {ALL_STATUSES}, got {status!r}")


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return limit


def check_id_cursor(after: Any) -> str | None:
    if after is None:
        return None
    if not is_id(after):
        raise InvalidInputError(f"after must be a next_cursor from a previous page, got {after!r}")
    return str(after)


def check_index_cursor(after: Any) -> str | None:
    if after is None:
        return None
    if not isinstance(after, str) or not after.isdigit():
        raise InvalidInputError(f"after must be a next_cursor from a previous page, got {after!r}")
    return after
