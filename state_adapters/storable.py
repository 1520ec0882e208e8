"""Text and JSON that every supported database (Postgres and SQLite) stores and reads
back equal, checked before any write (:mod:`state_adapters.validation` uses these for
every argument):

- text (type names, dedup keys, chain ids and every string inside JSON) is valid
  Unicode without NUL characters, which Postgres cannot store;
- JSON is strict: no NaN or Infinity, object keys are strings (``{1: x}`` would come
  back as ``{"1": x}``), integers fit in 64 bits, nesting is at most
  :data:`MAX_JSON_DEPTH` deep. Tuples are stored as lists.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NoReturn

from state_adapters.errors import InvalidInputError

MAX_JSON_DEPTH = 100
"""Deepest nesting of lists and objects accepted in a JSON value."""
JSON_INT_MIN, JSON_INT_MAX = -(2**63), 2**63 - 1
"""Integers in JSON: what the queue promises to store (SQLite turned a larger
top-level integer into a float until migration 0011 declared its JSON columns TEXT)."""


def check_text(value: str, what: str) -> str:
    """Return the string ``value`` if every database can store it: valid Unicode
    (no lone surrogates) without NUL characters."""
    if "\x00" in value:
        raise InvalidInputError(
            f"{what} contains a NUL character (\\x00), which Postgres cannot store"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} is not valid Unicode: lone surrogate {value[exc.start]!r} at "
            f"position {exc.start}"
        ) from None
    return value


_JSON_TYPES = "dict, list, str, int, float, bool, None"


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if every database stores it as JSON and reads it back equal
    (tuples come back as lists); the error names the offending place, e.g.
    ``input['items'][3]``."""
    # One walk, without recursion, accepts what ``json.dumps(allow_nan=False)`` accepts
    # (subclasses of the JSON types included) minus what a database would refuse or
    # change. Every value runs through it (inputs, outputs, progress), so it records
    # (node, parent position, key, depth) and spells a path out only for an error.
    if value is None:  # most inputs of a batch of starts: no walk to set up
        return None
    nodes: list[tuple[Any, int, Any, int]] = [(value, -1, None, 0)]
    stack = [0]
    while stack:
        position = stack.pop()
        node, _, _, depth = nodes[position]
        if node is None or isinstance(node, bool):
            continue
        if isinstance(node, str):
            if not _plain_text(node):
                check_text(node, _json_path(nodes, position, what))
        elif isinstance(node, int):
            if not JSON_INT_MIN <= node <= JSON_INT_MAX:
                path = _json_path(nodes, position, what)
                raise InvalidInputError(
                    f"{path} is an integer outside 64 bits ({node}); send it as a string"
                )
        elif isinstance(node, float):
            if not math.isfinite(node):
                path = _json_path(nodes, position, what)
                raise InvalidInputError(
                    f"{what} must be JSON-serializable ({_JSON_TYPES}): {path} is {node}, "
                    "which JSON cannot represent"
                )
        elif isinstance(node, dict):
            if depth >= MAX_JSON_DEPTH:
                _refuse_deep(value, what)
            for key, item in node.items():
                if not (isinstance(key, str) and _plain_text(key)):
                    path = _json_path(nodes, position, what)
                    if not isinstance(key, str):
                        raise InvalidInputError(
                            f"{path} has the key {key!r} ({type(key).__name__}); JSON object "
                            "keys must be strings"
                        )
                    check_text(key, f"a key of {path}")
                stack.append(len(nodes))
                nodes.append((item, position, key, depth + 1))
        elif isinstance(node, list | tuple):
            if depth >= MAX_JSON_DEPTH:
                _refuse_deep(value, what)
            for index, item in enumerate(node):
                stack.append(len(nodes))
                nodes.append((item, position, index, depth + 1))
        else:
            path = _json_path(nodes, position, what)
            raise InvalidInputError(
                f"{what} must be JSON-serializable ({_JSON_TYPES}): {path} is an object of "
                f"type {type(node).__name__}, which is not JSON serializable"
            )
    return value


def _refuse_deep(value: Any, what: str) -> NoReturn:
    """Raise for a value nested deeper than :data:`MAX_JSON_DEPTH`, saying whether it
    is a cycle (which the JSON encoder detects) or only deep."""
    try:
        json.dumps(value)
    except ValueError as exc:  # "Circular reference detected"
        raise InvalidInputError(
            f"{what} must be JSON-serializable ({_JSON_TYPES}): {exc}"
        ) from None
    except RecursionError:
        pass
    raise InvalidInputError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")


def _plain_text(text: str) -> bool:
    """True when :func:`check_text` would accept ``text`` (ASCII answers fastest)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_path(nodes: Sequence[tuple[Any, int, Any, int]], position: int, what: str) -> str:
    """``input['items'][3]``: how to reach ``nodes[position]`` from the root."""
    keys = []
    while position > 0:
        _, position, key, _ = nodes[position]
        keys.append(f"[{key!r}]")
    return what + "".join(reversed(keys))
