"""How :meth:`~queuert_notify.Client.prune` paces its batches, so that deleting a large
backlog never holds up the claims of a concurrent drain for long.

Two bounds, each for one cost a batch imposes on everything else:

- **how long one batch holds its locks**: a batch is sized to take about
  :data:`BATCH_SECONDS` (on SQLite a claim waits for the whole batch, and SQLite's busy
  handler then sleeps in steps of 1, 2, 5, 10 ... ms, so a long batch costs a claim far
  more than its own duration); the size follows the last batch's duration, within
  ``[MIN_SIZE, batch_size]`` (a batch has a fixed cost of a few round trips: with
  fewer chains than that, pruning would fall behind the chains that finish);
- **how much of the time pruning runs at all**: after each batch the pruner waits
  :data:`PAUSE_FACTOR` times as long as the batch took, so it holds a server core
  and the write lock at most a third of the time.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from queuert_notify.errors import InvalidInputError
from state_adapters.validation import check_positive_int

BATCH_SECONDS = 0.005
"""The duration a batch is sized for."""
MIN_SIZE = 50
"""The fewest chains a batch is sized down to (unless ``batch_size`` is smaller)."""
PAUSE_FACTOR = 2.0
"""The wait after a batch, in multiples of the batch's duration."""


def prune_horizon(older_than: object, batch_size: object) -> datetime:
    """The time before which a prune deletes the chains that finished, ``older_than``
    ago; both arguments checked (``InvalidInputError``) before anything is deleted."""
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidInputError(
            f"older_than must be a timedelta >= 0 (e.g. timedelta(days=7)), got {older_than!r}"
        )
    check_positive_int(batch_size, "batch_size")
    return datetime.now(UTC) - older_than


class PrunePacing:
    """The size of the next batch and the pause before it, from the last batch's duration."""

    def __init__(self, batch_size: int) -> None:
        self.max_size = batch_size
        self.min_size = min(MIN_SIZE, batch_size)
        self.size = batch_size

    def batch_took(self, seconds: float) -> float:
        """Record how long the last batch (of :attr:`size` chains) took; returns the
        pause before the next one."""
        fitting = self.size * BATCH_SECONDS / max(seconds, 1e-6)
        # The geometric mean of the old and the fitting size: one slow batch (a checkpoint,
        # a busy core) halves nothing at once, and the size still settles in a few batches.
        self.size = max(self.min_size, min(self.max_size, round(math.sqrt(self.size * fitting))))
        return PAUSE_FACTOR * seconds
