"""``Client`` and ``SyncClient`` are one API: the same method names with the same
parameters (names, kinds, defaults), async on one and sync on the other. The only
differences are the ones listed here and in docs/sync-apps.md ("One API, two clients")."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from queuert_notify import Client, SyncClient

pytest_plugins = ["tests.support.queue_fixtures"]

BOTH = pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True)

ONLY_ON_CLIENT = {
    "connect": "the async client connects its notify adapter; SyncClient's sends from a thread",
    "flush": "publishes a buffer on the event loop's sender task",
    "cancel": "deprecated alias of cancel_chain (removed in the next release)",
    "trigger": "deprecated alias of trigger_chain (removed in the next release)",
}
ONLY_ON_SYNC_CLIENT: dict[str, str] = {}

THE_CHAIN_FAMILY = {
    "start_chain",
    "start_chains",
    "get_chain",
    "await_chain",
    "cancel_chain",
    "retry_chain",
    "trigger_chain",
    "list_chains",
    "get_job",
    "list_jobs",
    "pause_type",
    "resume_type",
    "paused_types",
    "set_limits",
    "prune",
    "migrate",
    "workers",
    "health",
}


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_")
    }


def parameters(method: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Name, kind and default of each parameter but ``self`` (annotations differ: an
    ``AsyncSession`` on one, a ``Session`` on the other)."""
    signature = inspect.signature(method)
    return [(p.name, p.kind, p.default) for p in list(signature.parameters.values())[1:]]


def test_both_clients_have_the_same_methods_but_the_documented_ones() -> None:
    on_client = set(public_methods(Client))
    on_sync = set(public_methods(SyncClient))
    assert on_client - on_sync == set(ONLY_ON_CLIENT)
    assert on_sync - on_client == set(ONLY_ON_SYNC_CLIENT)
    assert on_client & on_sync >= THE_CHAIN_FAMILY


def test_shared_methods_take_the_same_parameters() -> None:
    client, sync = public_methods(Client), public_methods(SyncClient)
    for name in sorted(set(client) & set(sync)):
        assert parameters(client[name]) == parameters(sync[name]), name


def test_shared_methods_are_async_on_client_and_sync_on_sync_client() -> None:
    client, sync = public_methods(Client), public_methods(SyncClient)
    for name in sorted(set(client) & set(sync) - {"close"}):
        assert inspect.iscoroutinefunction(client[name]), name
        assert not inspect.iscoroutinefunction(sync[name]), name


async def test_the_old_names_still_work_and_warn(client: Client) -> None:
    chain = await client.start_chain("parity", {"n": 1}, delay=3600)
    with pytest.warns(DeprecationWarning, match="trigger_chain"):
        triggered = await client.trigger(chain.id)
    assert triggered.status == "pending"
    with pytest.warns(DeprecationWarning, match="cancel_chain"):
        cancelled = await client.cancel(chain.id)
    assert cancelled.status == "cancelled"


@BOTH
async def test_sync_client_operates_the_queue_as_the_async_client_sees_it(
    client: Client, sync_engine: Engine, table_prefix: str
) -> None:
    sync = SyncClient(sync_engine, table_prefix=table_prefix)
    later = sync.start_chain("parity", {"n": 1}, delay=3600)
    job = sync.trigger_chain(later.id).last_job
    assert job.scheduled_at <= datetime.now(UTC)
    assert sync.get_job(job.id) == await client.get_job(job.id)

    sync.pause_type("parity")
    assert sync.paused_types() == await client.paused_types() == {"parity"}
    sync.resume_type("parity")
    assert await client.paused_types() == set()
    limits = sync.set_limits("parity", concurrency=2, rate=10, per=timedelta(minutes=1))
    assert (limits.concurrency, limits.rate, limits.per_seconds) == (2, 10, 60.0)

    done = sync.start_chain("parity", {"n": 2})
    sync.complete_chain(done.id, {"ok": True})
    page = sync.list_chains(type_name="parity", limit=1)
    assert [c.id for c in page.items] == [done.id] and page.next_cursor == done.id
    assert [c.id for c in sync.list_chains(after=page.next_cursor).items] == [later.id]
    assert [j.chain_id for j in sync.list_jobs(status="completed").items] == [done.id]
    assert sync.count_jobs(type_names=["parity"]) == await client.count_jobs(type_names=["parity"])
    assert sync.prune(older_than=timedelta(0)) == 1
    sync.delete_chain(later.id)
    assert (await client.list_chains()).items == []
