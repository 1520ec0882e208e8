"""How prune sizes and spaces its batches (queuert_notify/maintenance/prune_pacing.py): a batch
holds its locks about BATCH_SECONDS, never fewer than MIN_SIZE chains, and pruning runs at most
a third of the time."""

from __future__ import annotations

from queuert_notify.maintenance.prune_pacing import BATCH_SECONDS, MIN_SIZE, PrunePacing


def _settle(pacing: PrunePacing, seconds_per_chain: float, fixed: float = 0.0) -> int:
    for _ in range(30):
        pacing.batch_took(fixed + pacing.size * seconds_per_chain)
    return pacing.size


def test_slow_batches_shrink_until_a_batch_takes_about_the_target() -> None:
    pacing = PrunePacing(500)
    # 100 µs a chain: 500 chains would hold the locks 50 ms.
    size = _settle(pacing, 100e-6)
    assert abs(size * 100e-6 - BATCH_SECONDS) <= BATCH_SECONDS * 0.1


def test_batches_never_shrink_below_the_minimum_so_pruning_keeps_up() -> None:
    pacing = PrunePacing(500)
    assert _settle(pacing, 1e-6, fixed=0.050) == MIN_SIZE
    assert _settle(PrunePacing(20), 1e-3) == 20  # a smaller batch_size is its own minimum


def test_fast_batches_grow_back_to_batch_size_and_no_further() -> None:
    pacing = PrunePacing(500)
    _settle(pacing, 1e-3)
    assert pacing.size < 500
    assert _settle(pacing, 1e-6) == 500


def test_pruning_runs_at_most_a_third_of_the_time() -> None:
    pause = PrunePacing(500).batch_took(0.012)
    assert 0.012 / (0.012 + pause) <= 1 / 3
