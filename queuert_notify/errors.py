"""Every exception queuert-notify raises on purpose, in one place.

Each message says what went wrong and what to do about it; none carries
credentials (URLs are shown with their password masked).
"""

from __future__ import annotations


class QueuertError(Exception):
    """Base class of every error raised by queuert-notify."""


class ConfigurationError(QueuertError):
    """A setting is wrong: bad URL or scheme, bad prefix, unsupported dialect,
    or a server that does not answer at the address tried."""


class NotifyAdapterClosedError(QueuertError):
    """A notify adapter was used after ``close()``; create a new adapter."""


class JobOwnershipLostError(QueuertError):
    """This worker no longer owns the job: its lease expired and was reaped,
    the job was cancelled or completed elsewhere. The write was not applied."""


class ChainNotFoundError(QueuertError):
    """No chain with that id exists (never created, or deleted)."""


class JobNotFoundError(QueuertError):
    """No job with that id exists."""


class WaitChainTimeoutError(QueuertError, TimeoutError):
    """``await_chain`` gave up before the chain reached a final status."""


class InvalidInputError(QueuertError, ValueError):
    """An argument was rejected before anything was written: input or output
    that is not JSON-serializable, an empty type name, an over-long key, a
    negative delay or count, unknown blocker chains."""


class ChainInUseError(QueuertError):
    """A chain cannot be deleted because other jobs are still blocked on it."""


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for messages and logs)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
