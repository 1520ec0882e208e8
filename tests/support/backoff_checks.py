"""Judging a reconnect loop by the times its attempts reached a server (a TcpProxy's
``reset_times``): the pauses between attempts must grow, as ``state_adapters.backoff``
promises, so a fixed pause — a hot loop or a slow one — fails the check."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise


def pauses_between_rounds(times: Sequence[float], per_round: int = 1) -> list[float]:
    """The pause before each round after the first, where a round is ``per_round``
    consecutive attempts (a client that retries a connect itself makes several per
    round of the loop); an incomplete last round is left out."""
    rounds = [times[i : i + per_round] for i in range(0, len(times), per_round)]
    rounds = [r for r in rounds if len(r) == per_round]
    return [later[0] - earlier[-1] for earlier, later in pairwise(rounds)]


def assert_backoff_grows(times: Sequence[float], per_round: int = 1) -> None:
    """The last two pauses together are at least three times the first two: a doubling
    backoff gives about ten times over six rounds, a fixed pause about once."""
    pauses = pauses_between_rounds(times, per_round)
    assert len(pauses) >= 4, f"too few reconnect rounds to judge the backoff: {list(times)}"
    first, last = sum(pauses[:2]), sum(pauses[-2:])
    assert last >= 3 * first, f"the reconnect backoff does not grow: pauses {pauses}"
