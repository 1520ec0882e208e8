"""Every exception queuert-notify raises on purpose, in one place.

The state layer's own errors are defined in :mod:`state_adapters.errors` (it never
imports this package) and re-exported here; the notify adapters' and the client's
are defined here. Each message says what went wrong and what to do about it; none
carries credentials (URLs are shown with their password masked).
"""

from __future__ import annotations

from state_adapters.errors import (
    ChainInUseError,
    ChainNotFoundError,
    ConfigurationError,
    DatabaseUnavailableError,
    InvalidInputError,
    JobNotFoundError,
    JobOwnershipLostError,
    QueuertError,
    mask_url,
)


class NotifyAdapterClosedError(QueuertError):
    """A notify adapter was used after ``close()``; create a new adapter."""


class WaitChainTimeoutError(QueuertError, TimeoutError):
    """``await_chain`` gave up before the chain reached a final status."""


__all__ = [
    "ChainInUseError",
    "ChainNotFoundError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "InvalidInputError",
    "JobNotFoundError",
    "JobOwnershipLostError",
    "NotifyAdapterClosedError",
    "QueuertError",
    "WaitChainTimeoutError",
    "mask_url",
]
