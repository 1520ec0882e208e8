"""The exceptions the state layer raises on purpose (re-exported, with the notify and
client errors, from :mod:`queuert_notify.errors`, where users find every one).

Each message says what went wrong and what to do about it; none carries
credentials (URLs are shown with their password masked).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


class QueuertError(Exception):
    """Base class of every error raised by queuert-notify."""


class ConfigurationError(QueuertError):
    """A setting is wrong: bad URL or scheme, bad prefix, unsupported dialect,
    or a server that does not answer at the address tried."""


class JobOwnershipLostError(QueuertError):
    """This worker no longer owns the job: its lease expired and was reaped,
    the job was cancelled or completed elsewhere. The write was not applied."""


class ChainNotFoundError(QueuertError):
    """No chain with that id exists (never created, or deleted)."""


class JobNotFoundError(QueuertError):
    """No job with that id exists."""


class InvalidInputError(QueuertError, ValueError):
    """An argument was rejected before anything was written: input or output
    that is not JSON-serializable, an empty type name, an over-long key, a
    negative delay or count, unknown blocker chains."""


class ChainInUseError(QueuertError):
    """A chain cannot be deleted because other jobs are still blocked on it."""


class DatabaseUnavailableError(QueuertError):
    """A client operation gave up after its bounded wait (``Client(database_timeout=...)``)
    for a database that does not answer; the message names the address (password
    masked) and the driver's one-line reason."""


def cannot_connect_reason(exc: BaseException, password: str | None) -> str:
    """The first line of the driver's message for a failed connection (the error
    SQLAlchemy wraps, if any), with ``password`` masked should the driver echo it."""
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    return reason.replace(password, "***") if password else reason


def cannot_connect(address: str, reason: str, *, sqlite: bool) -> str:
    """The one line every entry point (CLI, ``migrate()``, clients, workers) says about a
    database it cannot connect to: where (``address``, password masked by the caller),
    why, and what to check."""
    hint = (
        "does its directory exist, and may this user write there?"
        if sqlite
        else "is the server running, and are the address and credentials right?"
    )
    return f"cannot connect to the database at {address}: {reason}; {hint}"


def unreachable(url: URL, exc: BaseException) -> ConfigurationError:
    """:func:`cannot_connect` as the :class:`ConfigurationError` of a connection to
    ``url`` that failed with ``exc`` (``migrate()``, a worker's start)."""
    address = mask_url(url.render_as_string(hide_password=False))
    reason = cannot_connect_reason(exc, url.password)
    return ConfigurationError(
        cannot_connect(address, reason, sqlite=url.get_backend_name() == "sqlite")
    )


def mask_url(url: str, *, user_is_secret: bool = False) -> str:
    """Return ``url`` with its password replaced by ``***`` (for messages and logs).

    Masks the password of the authority (``user:secret@host``) and query
    parameters named ``*password`` (``password=``, ``ssl_password=``); with
    ``user_is_secret`` (NATS, where ``token@host`` is a token) a lone user name
    too. Never raises: a URL it cannot take apart is shown as its scheme only.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        scheme = url.partition("://")[0] if "://" in url else ""
        return f"{scheme}://<unparseable URL>" if scheme.isalnum() else "<unparseable URL>"
    masked = url
    userinfo, _, host = parts.netloc.rpartition("@")
    if userinfo:
        user, colon, _password = userinfo.partition(":")
        if colon or user_is_secret:
            shown = f"{user}:***" if colon else "***"
            masked = masked.replace(parts.netloc, f"{shown}@{host}", 1)
    if parts.query:
        query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
        masked = masked.replace(f"?{parts.query}", f"?{query}", 1)
    return masked


_QUERY_PASSWORD = re.compile(r"((?:^|&)[^=&]*password=)[^&]*", re.IGNORECASE)
