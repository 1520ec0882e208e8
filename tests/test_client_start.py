"""Starting chains: validation before any write, transactional enqueue, deduplication."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.errors import ChainNotFoundError, InvalidInputError
from queuert_notify.notify.protocol import NotifyAdapter
from tests.support.queue_helpers import wait_until

pytest_plugins = ["tests.support.queue_fixtures"]


async def _total_jobs(client: Client) -> int:
    return sum((await client.count_jobs()).values())


async def _record_scheduled(notify: NotifyAdapter, types: list[str]) -> list[str]:
    seen: list[str] = []
    await notify.listen_job_scheduled(types, seen.append)
    return seen


class _NotJson:
    pass


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("",), {}),
        (("   ",), {}),
        (("t", _NotJson()), {}),
        (("t", {"x": float("nan")}), {}),
        (("t", {1, 2}), {}),
        (("t",), {"delay": -1}),
        (("t",), {"delay": float("inf")}),
        (("t",), {"run_at": datetime(2030, 1, 1)}),  # naive
        (("t",), {"run_at": datetime.now(UTC), "delay": 1}),
        (("t",), {"max_attempts": 0}),
        (("t",), {"priority": "high"}),
        (("t",), {"dedup_key": ""}),
        (("t",), {"dedup_key": "k" * 1000}),
        (("t",), {"dedup_scope": "sometimes"}),
        (("t",), {"dedup_window": 0}),
        (("t",), {"blockers": "not-a-list"}),
    ],
)
async def test_invalid_arguments_are_rejected_before_anything_is_written(
    client: Client, notify: NotifyAdapter, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    seen = await _record_scheduled(notify, ["t", ""])
    with pytest.raises(InvalidInputError):
        await client.start_chain(*args, **kwargs)
    assert await _total_jobs(client) == 0
    assert seen == []


async def test_one_invalid_spec_rejects_the_whole_batch(client: Client) -> None:
    with pytest.raises(InvalidInputError, match="JSON"):
        await client.start_chains([ChainSpec("t", {"ok": 1}), ChainSpec("t", object())])
    assert await _total_jobs(client) == 0


async def test_start_chains_creates_all_chains_in_order(client: Client) -> None:
    started = await client.start_chains([ChainSpec("t", {"n": n}) for n in range(5)])
    assert len({chain.id for chain in started}) == 5
    for n, chain in enumerate(started):
        record = await client.get_chain(chain.id)
        assert record.last_job.input == {"n": n}
        assert record.status == "pending"


async def test_chain_started_in_a_rolled_back_transaction_leaves_nothing_and_publishes_nothing(
    client: Client, notify: NotifyAdapter, engine: AsyncEngine
) -> None:
    seen = await _record_scheduled(notify, ["t"])
    async with AsyncSession(engine) as session:
        await session.begin()
        chain = await client.start_chain("t", {"x": 1}, session=session)
        await session.rollback()
    with pytest.raises(ChainNotFoundError):
        await client.get_chain(chain.id)
    await _settle()
    assert seen == []


async def test_chain_started_in_a_caller_transaction_is_published_only_after_commit(
    client: Client, notify: NotifyAdapter, engine: AsyncEngine
) -> None:
    seen = await _record_scheduled(notify, ["t"])
    async with AsyncSession(engine) as session:
        async with session.begin():
            chain = await client.start_chain("t", {"x": 1}, session=session)
            await _settle()
            assert seen == []
        await wait_until(lambda: seen == ["t"], timeout=5)
    assert (await client.get_chain(chain.id)).status == "pending"


async def test_same_dedup_key_returns_the_existing_chain(client: Client) -> None:
    first = await client.start_chain("t", {"v": 1}, dedup_key="order-42")
    second = await client.start_chain("t", {"v": 2}, dedup_key="order-42")
    assert not first.deduplicated
    assert second.deduplicated
    assert second.id == first.id
    assert (await client.get_chain(first.id)).last_job.input == {"v": 1}


async def test_delay_schedules_the_first_job_in_the_future(client: Client) -> None:
    before = datetime.now(UTC)
    chain = await client.start_chain("t", None, delay=3600)
    job = (await client.get_chain(chain.id)).last_job
    assert job.scheduled_at.replace(tzinfo=job.scheduled_at.tzinfo or UTC) >= before + timedelta(
        seconds=3590
    )


async def _settle() -> None:
    """Give after-commit tasks and in-process deliveries a chance to run."""
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_input_is_validated_once_per_start(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from state_adapters import validation

    walked: list[str] = []
    check_json = validation.check_json

    def counting(value: Any, what: str) -> Any:
        walked.append(what)
        return check_json(value, what)

    monkeypatch.setattr(validation, "check_json", counting)
    await client.start_chain("job", {"deep": [1, 2, {"x": "y"}]})
    await client.start_chains([ChainSpec("job", n) for n in range(3)])
    assert walked == ["input"] * 4
