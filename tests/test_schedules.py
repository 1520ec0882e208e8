"""Schedule: what a schedule's ticks are, what its chains carry, and which schedules are
refused at construction (no database involved)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queuert_notify import InvalidInputError, Schedule, Worker
from queuert_notify.client.client import Client
from queuert_notify.notify.noop import NoopNotifyAdapter

BERLIN_SPRING = datetime(2026, 3, 29, tzinfo=UTC)  # 02:00 -> 03:00 local
BERLIN_AUTUMN = datetime(2026, 10, 25, tzinfo=UTC)  # 03:00 -> 02:00 local


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron"),
        ({"cron": "* * * * *", "every": timedelta(seconds=1)}, "exactly one of cron"),
        ({"cron": "61 * * * *"}, "invalid"),
        ({"cron": "* * *"}, "invalid"),
        ({"cron": "0 0 30 2 *"}, "invalid"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"every": timedelta(0)}, "positive timedelta"),
        ({"every": timedelta(seconds=-5)}, "positive timedelta"),
        ({"every": 30}, "positive timedelta"),
        ({"every": timedelta(seconds=1), "timezone": "UTC"}, "cron schedules only"),
        ({"every": timedelta(seconds=1), "input": [1]}, "JSON object"),
        ({"every": timedelta(seconds=1), "input": {"tick": 1}}, "'tick'"),
        ({"every": timedelta(seconds=1), "input": {"x": object()}}, "input"),
    ],
)
def test_a_bad_schedule_is_refused_when_it_is_built(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Schedule("s", "t", **options)


@pytest.mark.parametrize("name", ["", "   ", "x" * 201, "nul\x00"])
def test_a_bad_schedule_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInputError):
        Schedule(name, "t", every=timedelta(seconds=1))


def test_two_schedules_of_one_worker_may_not_share_a_name() -> None:
    client = Client(state=object(), notify=NoopNotifyAdapter())  # type: ignore[arg-type]
    same = [Schedule("s", "t", every=timedelta(seconds=1)), Schedule("s", "u", cron="* * * * *")]
    with pytest.raises(InvalidInputError, match="two schedules"):
        Worker(client, {"t": lambda job, ctx: None}, schedules=same)
    with pytest.raises(InvalidInputError, match="retention"):
        Worker(client, {"t": lambda job, ctx: None}, retention=timedelta(0))


def test_every_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    schedule = Schedule("s", "t", every=timedelta(seconds=30))
    now = datetime(2026, 1, 1, 12, 0, 44, 500, tzinfo=UTC)
    assert schedule.latest_tick(now) == datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert schedule.next_tick(now) == datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    exactly = datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    assert schedule.latest_tick(exactly) == exactly
    assert schedule.next_tick(exactly) == exactly + timedelta(seconds=30)


def test_cron_ticks_are_read_in_the_schedules_timezone() -> None:
    schedule = Schedule("s", "t", cron="0 3 * * *", timezone="Europe/Berlin")
    now = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert schedule.latest_tick(now) == datetime(2026, 1, 10, 2, 0, tzinfo=UTC)
    assert schedule.next_tick(now) == datetime(2026, 1, 11, 2, 0, tzinfo=UTC)
    on_the_tick = datetime(2026, 1, 10, 2, 0, tzinfo=UTC)
    assert schedule.latest_tick(on_the_tick) == on_the_tick


def test_a_tick_in_the_hour_dst_skips_runs_once_when_the_clock_jumps() -> None:
    schedule = Schedule("s", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    ticks = _ticks(schedule, BERLIN_SPRING - timedelta(days=1), 3)
    # 02:30 does not exist on 29 March: it runs at 03:00 local (01:00 UTC), once.
    assert ticks == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
    ]


def test_a_tick_in_the_hour_dst_repeats_runs_once() -> None:
    schedule = Schedule("s", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    ticks = _ticks(schedule, BERLIN_AUTUMN - timedelta(days=1), 3)
    # 02:30 happens twice on 25 October: only the first one is a tick.
    assert ticks == [
        datetime(2026, 10, 24, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
    ]
    second_half_hour = datetime(2026, 10, 25, 1, 45, tzinfo=UTC)  # 02:45 local, again
    assert schedule.latest_tick(second_half_hour) == ticks[1]


def test_the_chain_of_a_tick_carries_the_tick_and_a_dedup_key_kept_forever() -> None:
    schedule = Schedule(
        "nightly", "report", cron="0 3 * * *", timezone="Europe/Berlin", input={"kind": "x"}
    )
    tick = datetime(2026, 1, 10, 2, 0, tzinfo=UTC)
    chain = schedule.new_chain(tick)
    assert chain.job.type_name == "report"
    assert chain.job.input == {"kind": "x", "tick": "2026-01-10T03:00:00+01:00"}
    assert chain.dedup_key == "schedule:nightly@2026-01-10T02:00:00+00:00"
    assert chain.dedup_scope == "ever"
    assert datetime.fromisoformat(chain.job.input["tick"]) == tick


def _ticks(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    ticks = []
    for _ in range(count):
        after = schedule.next_tick(after)
        ticks.append(after)
    return ticks
