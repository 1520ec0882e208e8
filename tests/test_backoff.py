"""The one backoff helper every reconnect loop uses."""

from __future__ import annotations

import pytest

from state_adapters.backoff import Backoff
from tests.support.backoff_checks import assert_backoff_grows


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


def _attempt_times(pauses: list[float]) -> list[float]:
    times = [0.0]
    for pause in pauses:
        times.append(times[-1] + pause + 0.002)  # each attempt itself takes a little
    return times


def test_the_reconnect_check_passes_the_backoff_and_fails_a_fixed_pause() -> None:
    """The check the fault tests apply to real reconnect attempts has teeth."""
    backoff = Backoff(0.05, 2.0)
    assert_backoff_grows(_attempt_times([backoff.next() for _ in range(6)]))
    for fixed in (0.0, 0.05, 0.5, 2.0):
        with pytest.raises(AssertionError, match="does not grow"):
            assert_backoff_grows(_attempt_times([fixed] * 6))
