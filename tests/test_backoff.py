"""The one backoff helper every reconnect loop uses."""

from __future__ import annotations

import pytest

from state_adapters.backoff import Backoff


def test_pauses_grow_until_the_maximum_and_stay_there() -> None:
    backoff = Backoff(0.1, 1.0)
    steps = []
    for _ in range(8):
        steps.append(backoff.step)
        pause = backoff.next()
        assert steps[-1] / 2 <= pause <= steps[-1]
    assert steps == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]


def test_reset_starts_again_from_the_first_step() -> None:
    backoff = Backoff(0.05, 2.0)
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.step == 0.05 and backoff.next() <= 0.05


@pytest.mark.parametrize(("first", "maximum"), [(0, 1), (-1, 1), (2, 1)])
def test_nonsense_bounds_are_refused(first: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="0 < first <= maximum"):
        Backoff(first, maximum)
