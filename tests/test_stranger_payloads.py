"""Messages strangers publish on our channels: ignored, counted, never fatal.

Anyone allowed to publish on a notify channel can send any bytes. Each adapter
drops what a sender of ours could not have published (empty, oversized, binary,
not UTF-8, holding NUL), counts it in ``adapter.ignored_messages``, and keeps
delivering; well-formed text nobody listens for is simply not routed. The
per-adapter basics live next to each adapter's tests; here every kind of junk
goes through each real transport, and a worker is flooded while it works.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES
from queuert_notify.testing import Recorder
from queuert_notify.worker.worker import Worker
from tests.support.queue_helpers import delete_notify_state, make_notify
from tests.support.strangers import stranger

pytest_plugins = ["tests.support.queue_fixtures"]

KINDS = ("sched", "chainc", "owls")

# (payload, dropped?) -- anything not dropped is well-formed text routed to nobody.
JUNK: list[tuple[bytes, bool]] = [
    (b"", True),
    (b"\x00", True),
    (b"t\x00", True),  # our own type name with a NUL tacked on
    (b"\xff\xfe\xfd binary", True),
    (b"\xed\xa0\x80", True),  # a UTF-8-encoded surrogate: not valid UTF-8
    (b"\xc3", True),  # a truncated multi-byte sequence
    (b"t" * (MAX_PAYLOAD_BYTES + 1), True),
    ("é".encode() * (MAX_PAYLOAD_BYTES // 2) + b"x", True),  # 1025 bytes, 513 characters
    (b"x" * 512 * 1024, True),  # huge
    (b"x" * MAX_PAYLOAD_BYTES, False),  # the largest payload we send ourselves
    (b'{"type_name": "t", "id": 1}', False),  # another system's JSON
    (b"42", False),
    (b" t ", False),
    ("t\u200b".encode(), False),  # zero-width space: not our "t"
]
# Postgres NOTIFY carries text of the database's encoding, under 8000 bytes: no NUL,
# no invalid UTF-8, no huge payloads reach us at all.
PG_JUNK: list[tuple[bytes, bool]] = [
    (b"", True),
    (b"t" * (MAX_PAYLOAD_BYTES + 1), True),
    (b"t" * 7999, True),
    (b"x" * MAX_PAYLOAD_BYTES, False),
    (b'{"type_name": "t"}', False),
    (b" t ", False),
]


@pytest.mark.parametrize("kind", ["redis", "nats", "postgres"])
async def test_every_kind_of_junk_is_ignored_counted_exactly_and_delivery_goes_on(
    kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    junk = PG_JUNK if kind == "postgres" else JUNK
    adapter = make_notify(kind, request, prefix)
    try:
        async with adapter, stranger(kind, request, prefix) as publish:
            scheduled, completed, lost = Recorder(), Recorder(), Recorder()
            await adapter.listen_job_scheduled(["t"], scheduled)
            await adapter.listen_chain_completed("c", completed)
            await adapter.listen_job_ownership_lost("j", lost)
            for what in KINDS:
                for data, _ in junk:
                    await publish(what, data)
            # One good message per channel after the junk: each channel delivers in
            # order, so once these arrive every message before them was handled.
            await publish("sched", b"t")
            await publish("chainc", b"c")
            await publish("owls", b"j")
            await scheduled.wait_for(1, within=10.0)
            await completed.wait_for(1, within=10.0)
            await lost.wait_for(1, within=10.0)

            assert scheduled.calls == [("t",)]
            assert completed.calls == [()]
            assert lost.calls == [()]
            dropped = sum(1 for _, is_dropped in junk if is_dropped)
            assert adapter.ignored_messages == dropped * len(KINDS)

            # Still subscribed and routing: the adapter's own publish goes through.
            await adapter.notify_job_scheduled("t")
            await scheduled.wait_for(2, within=5.0)
    finally:
        await delete_notify_state(kind, request, prefix)


@pytest.mark.parametrize("notify_kind", ["redis", "nats"], indirect=True)
async def test_a_worker_keeps_working_while_strangers_flood_its_channels(
    client: Client, notify_kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    """With a 60 s poll, every chain completing in time proves the wakeups got through
    the flood; junk includes our own type name, which only costs a wasted poll."""
    junk = [data for data, _ in JUNK if len(data) <= 64 * 1024]
    async with stranger(notify_kind, request, prefix) as publish:
        rng = random.Random(1234)
        flooding = True

        async def flood() -> None:
            while flooding:
                # Now and then a stranger announces work that is not there.
                data = b"work" if rng.random() < 0.05 else rng.choice(junk)
                await publish(rng.choice(KINDS), data)
                await asyncio.sleep(0.001)

        async def handler(job: Job, ctx: JobContext) -> int:
            return int(job.input)

        async with Worker(client, {"work": handler}, poll_interval=60.0, concurrency=4):
            flooder = asyncio.create_task(flood())
            try:
                await asyncio.sleep(0.2)  # the flood is under way
                chains = [await client.start_chain("work", n) for n in range(20)]
                for n, chain in enumerate(chains):
                    done = await client.await_chain(chain.id, timeout=20)
                    assert (done.status, done.output) == ("completed", n)
            finally:
                flooding = False
                await flooder
        assert not flooder.exception()
    assert getattr(client.notify, "ignored_messages", 0) > 0
