"""NatsNotifyAdapter: the conformance suite, exact wake budgets under racing consumers,
the no-JetStream fallback, configuration errors and strangers on our subjects."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.js.api import StorageType

from queuert_notify import ConfigurationError, InvalidInputError, NatsNotifyAdapter
from queuert_notify.notify.nats import MAX_PAYLOAD_BYTES, default_bucket, hint_key, subject_name
from queuert_notify.testing import NotifyAdapterConformance, Recorder
from tests.support.queue_helpers import delete_nats_bucket, other_tasks
from tests.support.services import OwnServer, free_port


@pytest.fixture
async def bucket(nats_url: str, prefix: str) -> AsyncIterator[str]:
    """The default hint bucket of this test's prefix, deleted afterwards."""
    yield default_bucket(prefix)
    await delete_nats_bucket(nats_url, default_bucket(prefix))


class TestNatsNotifyAdapter(NotifyAdapterConformance):
    @pytest.fixture
    async def adapter(
        self, nats_url: str, prefix: str, bucket: str
    ) -> AsyncIterator[NatsNotifyAdapter]:
        async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
            yield adapter

    @pytest.fixture
    async def peer_adapter(self, nats_url: str, prefix: str) -> AsyncIterator[NatsNotifyAdapter]:
        async with NatsNotifyAdapter(nats_url, prefix=prefix) as peer:
            yield peer

    # The one case run again when it fails. nats-server 2.9.10 (this CI's) now and then
    # drops the first message another connection publishes right after a subscription
    # was confirmed (docs/reliability.md); the adapter's second PING round trip after
    # each SUBSCRIBE took that from 8 in 1,500 to none in 1,500 with bare nats-py, but the
    # cause is the server's and not understood. This case is the most exposed: it
    # subscribes one subject four times and needs the message after the last.
    @pytest.mark.flaky(reruns=2)
    async def test_resubscribing_after_the_last_listener_left_hears_again(
        self, adapter: NatsNotifyAdapter, peer_adapter: NatsNotifyAdapter
    ) -> None:
        await super().test_resubscribing_after_the_last_listener_left_hears_again(
            adapter, peer_adapter
        )


async def test_a_budget_of_three_wakes_exactly_three_of_six_racing_processes(
    nats_url: str, prefix: str, bucket: str
) -> None:
    async with AsyncExitStack() as stack:
        # Six adapters, six connections: the race is between clients, as between workers.
        consumers = [
            await stack.enter_async_context(NatsNotifyAdapter(nats_url, prefix=prefix))
            for _ in range(6)
        ]
        for round_number in range(3):
            type_name = f"race-{round_number}"
            await consumers[0].provide_wake_hint(type_name, 3)
            results = await asyncio.gather(*(c.consume_wake_hint(type_name) for c in consumers))
            assert results.count(True) == 3, results
            assert await consumers[1].consume_wake_hint(type_name) is False


async def test_concurrent_provides_from_several_clients_add_up(
    nats_url: str, prefix: str, bucket: str
) -> None:
    async with AsyncExitStack() as stack:
        providers = [
            await stack.enter_async_context(NatsNotifyAdapter(nats_url, prefix=prefix))
            for _ in range(4)
        ]
        await asyncio.gather(*(p.provide_wake_hint("t", 3) for p in providers))
        await asyncio.gather(*(p.notify_jobs_scheduled({"t": 2}) for p in providers))

        results = [await providers[0].consume_wake_hint("t") for _ in range(21)]
        assert results == [True] * 20 + [False]


async def test_type_names_that_are_not_valid_keys_get_budgets_of_their_own(
    nats_url: str, prefix: str, bucket: str
) -> None:
    names = ["send email", "t.*", "t>", "ünïcode", ".dot", "plain"]
    assert len({hint_key(name) for name in names}) == len(names)
    async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
        for name in names:
            await adapter.provide_wake_hint(name, 1)
        for name in names:
            assert await adapter.consume_wake_hint(name) is True
            assert await adapter.consume_wake_hint(name) is False


async def test_a_deleted_bucket_is_created_again_by_the_next_provide(
    nats_url: str, prefix: str, bucket: str
) -> None:
    async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
        await adapter.provide_wake_hint("t", 1)
        await delete_nats_bucket(nats_url, bucket)
        assert await adapter.consume_wake_hint("t") is True, "no budget: wake"
        await adapter.provide_wake_hint("t", 1)
        assert await adapter.consume_wake_hint("t") is True
        assert await adapter.consume_wake_hint("t") is False


async def test_the_default_bucket_keeps_budgets_in_memory_for_60_seconds(
    nats_url: str, prefix: str, bucket: str
) -> None:
    async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
        assert adapter.kv_bucket == bucket
        await adapter.provide_wake_hint("t", 2)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.key_value(bucket)
        config = (await js.stream_info(f"KV_{bucket}")).config
        assert config.max_age == 60
        assert config.storage == StorageType.MEMORY
        assert (await kv.get(hint_key("t"))).value == b"2"
    finally:
        await nc.close()


async def test_a_named_bucket_is_used_as_given(nats_url: str, prefix: str) -> None:
    name = f"{prefix}_custom"
    try:
        async with NatsNotifyAdapter(nats_url, prefix=prefix, kv_bucket=name) as adapter:
            assert adapter.kv_bucket == name
            await adapter.provide_wake_hint("t", 1)
        nc = await nats.connect(nats_url)
        try:
            kv = await nc.jetstream().key_value(name)
            assert (await kv.get(hint_key("t"))).value == b"1"
        finally:
            await nc.close()
    finally:
        await delete_nats_bucket(nats_url, name)


async def test_malformed_payloads_from_strangers_are_ignored_and_counted(
    nats_url: str, prefix: str, bucket: str
) -> None:
    stranger = await nats.connect(nats_url)
    try:
        async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
            scheduled, completed = Recorder(), Recorder()
            await adapter.listen_job_scheduled(["t"], scheduled)
            await adapter.listen_chain_completed("c", completed)
            sched, chainc = subject_name(prefix, "sched"), subject_name(prefix, "chainc")

            for garbage in [b"", b"\xff\xfe\x00", b"t" * (MAX_PAYLOAD_BYTES + 1)]:
                await stranger.publish(sched, garbage)
            await stranger.publish(chainc, b"c\xff")
            await stranger.publish(sched, b'{"type": "t"}')  # well-formed, for no one
            await stranger.publish(sched, b"t")
            await stranger.publish(chainc, b"c")
            await stranger.flush()

            await scheduled.wait_for(1, within=5.0)
            await completed.wait_for(1, within=5.0)
            assert scheduled.calls == [("t",)]
            assert completed.calls == [()]
            assert adapter.ignored_messages == 4
    finally:
        await stranger.close()


async def test_payloads_the_receiver_would_drop_are_refused_before_publishing(
    nats_url: str, prefix: str, bucket: str
) -> None:
    async with NatsNotifyAdapter(nats_url, prefix=prefix) as adapter:
        with pytest.raises(InvalidInputError):
            await adapter.notify_chain_completed("")
        with pytest.raises(InvalidInputError):
            await adapter.notify_job_scheduled("t" * (MAX_PAYLOAD_BYTES + 1))
        with pytest.raises(InvalidInputError):
            await adapter.notify_jobs_scheduled({"t": -1})
        with pytest.raises(InvalidInputError):
            await adapter.provide_wake_hint("t", -1)


@pytest.mark.parametrize("prefix", ["", "a b", "a.*", "a.>", "a..b", ".a", "a."])
def test_bad_prefixes_are_configuration_errors(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        NatsNotifyAdapter("nats://127.0.0.1:4222", prefix=prefix)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379", "127.0.0.1:4222", ""])
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError, match="NATS"):
        NatsNotifyAdapter(url)


def test_a_bad_bucket_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="bucket"):
        NatsNotifyAdapter("nats://127.0.0.1:4222", kv_bucket="has.dot")


async def test_unreachable_server_names_the_address_without_the_password() -> None:
    before = other_tasks()
    adapter = NatsNotifyAdapter(f"nats://alice:s3cret@127.0.0.1:{free_port()}", timeout=1.0)
    with pytest.raises(ConfigurationError) as caught:
        await adapter.connect()
    message = str(caught.value)
    assert "alice:***@127.0.0.1" in message
    assert "s3cret" not in message
    await adapter.close()
    assert other_tasks() == before


@pytest.fixture
def nats_without_jetstream(tmp_path: Path) -> Iterator[OwnServer]:
    port = free_port()
    server = OwnServer(["nats-server", "-a", "127.0.0.1", "-p", str(port)], port, tmp_path)
    try:
        server.start()
    except FileNotFoundError:
        pytest.skip("nats-server is not installed")
    try:
        yield server
    finally:
        server.kill()


async def test_without_jetstream_hints_degrade_to_always_wake_with_a_warning(
    nats_without_jetstream: OwnServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="queuert_notify.notify.nats"):
        async with NatsNotifyAdapter(nats_without_jetstream.url, prefix=prefix) as adapter:
            assert adapter.hints_enabled is False
            await adapter.provide_wake_hint("t", 1)
            assert [await adapter.consume_wake_hint("t") for _ in range(3)] == [True] * 3

            rec = Recorder()
            await adapter.listen_job_scheduled(["t"], rec)
            await adapter.notify_jobs_scheduled({"t": 1})
            await rec.wait_for(1, within=5.0)
    assert any("no JetStream" in record.getMessage() for record in caplog.records)


async def test_close_leaves_no_task_running(nats_url: str, prefix: str, bucket: str) -> None:
    before = other_tasks()
    adapter = NatsNotifyAdapter(nats_url, prefix=prefix)
    await adapter.connect()
    await adapter.listen_job_scheduled(["t"], Recorder())
    await adapter.listen_chain_completed("c", Recorder())
    await adapter.close()
    assert other_tasks() == before
