"""Notification payloads on the wire: what adapters publish and what they accept.

A payload is a type name, chain id or job id sent as UTF-8 text of 1 to
:data:`MAX_PAYLOAD_BYTES` bytes without NUL characters. Senders refuse anything
else before publishing (:func:`encode_payload` raises ``InvalidInputError``);
receivers drop anything else (:func:`decode_payload` returns None) and count it,
because anyone allowed to publish on our channels can send any bytes. The two
agree: every payload a sender accepts is decoded back to the same text.
"""

from __future__ import annotations

from collections.abc import Mapping

from queuert_notify.errors import InvalidInputError
from state_adapters.storable import check_text

MAX_PAYLOAD_BYTES = 1024
"""Longest payload (type name, chain id, job id) published or accepted, in UTF-8 bytes."""


def encode_payload(what: str, value: object) -> str:
    """Return ``value`` if receivers will accept it; raise ``InvalidInputError`` naming
    ``what`` (e.g. "type name") otherwise, before anything is published."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"the {what} must be a non-empty string, got {value!r}")
    check_text(value, f"the {what}")
    if len(value.encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise InvalidInputError(f"the {what} is longer than {MAX_PAYLOAD_BYTES} bytes in UTF-8")
    return value


def decode_payload(data: object) -> str | None:
    """The payload carried by ``data`` (bytes or text as the transport hands it over),
    or None when a sender of ours could not have published it. Never raises."""
    if isinstance(data, bytes | bytearray):
        if not 0 < len(data) <= MAX_PAYLOAD_BYTES:
            return None  # checked before decoding, so a huge message costs no copy
        text = decode_text(data)
    elif isinstance(data, str):
        text = data
    else:
        return None
    if text is None:
        return None
    try:
        return encode_payload("payload", text)
    except InvalidInputError:
        return None


def decode_text(data: object) -> str | None:
    """``data`` as text: a ``str`` as is, bytes decoded as strict UTF-8; None otherwise."""
    if isinstance(data, str):
        return data
    if isinstance(data, bytes | bytearray):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def check_count(count: object) -> int:
    """Return ``count`` if it is a wake-hint count: an ``int`` >= 0 (not a bool)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidInputError(f"wake hint count must be an int >= 0, got {count!r}")
    return count


def scheduled_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """What a ``notify_jobs_scheduled(counts)`` sends: every type name and count checked
    (``InvalidInputError`` before anything is sent), the types with a count of 0 left out."""
    return {
        encode_payload("type name", name): count
        for name, count in counts.items()
        if check_count(count) > 0
    }
