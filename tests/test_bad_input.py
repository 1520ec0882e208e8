"""Bad input is refused with a typed, actionable error before anything is written.

Complements test_client_start.py (empty names, naive run_at, sets, NaN, scopes):
here every refusal is checked against a snapshot of all four tables on both
databases, including values only a database would have choked on halfway
through a write (NUL, lone surrogates, huge numbers).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, select
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import (
    ChainNotFoundError,
    ConfigurationError,
    InProcessNotifyAdapter,
    InvalidInputError,
    NatsNotifyAdapter,
    NoopNotifyAdapter,
    PostgresNotifyAdapter,
    RedisNotifyAdapter,
)
from queuert_notify.cli import main as cli
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing import Recorder
from queuert_notify.worker.worker import Worker
from state_adapters.notifications import wait_for_notifications
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from state_adapters.storable import MAX_JSON_DEPTH
from state_adapters.validation import MAX_DEDUP_KEY_LENGTH, MAX_TYPE_NAME_LENGTH
from tests.support.json_values import same_json
from tests.support.queue_helpers import DATABASES, STATE_KINDS, delete_notify_state

pytest_plugins = ["tests.support.queue_fixtures"]

# Values bound and errors translated are the driver's: every driver. Checks made before
# any statement: SQLite and Postgres.
every_driver = pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
both_databases = pytest.mark.parametrize("state_kind", DATABASES, indirect=True)
on_postgres = pytest.mark.parametrize("state_kind", ["postgres"], indirect=True)
"""The strictest database: what it accepts, SQLite accepts too."""


async def _snapshot(state: SqlAlchemyStateAdapter) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the queue's tables."""
    tables = state.tables
    async with state.engine.connect() as conn:
        return {
            table.name: sorted((tuple(row) for row in await conn.execute(select(table))), key=repr)
            for table in (
                tables.chains,
                tables.jobs,
                tables.blockers,
                tables.dedup_keys,
                tables.type_controls,
            )
        }


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _circular() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


# Values JSON (or a database) cannot keep: each is refused, naming what is wrong.
UNSTORABLE = [
    pytest.param(float("inf"), "JSON", id="infinity"),
    pytest.param({"x": [1, float("-inf")]}, "JSON", id="nested-negative-infinity"),
    pytest.param({"x": float("nan")}, "JSON", id="nan"),
    pytest.param({"at": datetime.now(UTC)}, "JSON", id="datetime-without-codec"),
    pytest.param({"on": date(2030, 1, 1)}, "JSON", id="date"),
    pytest.param({"amount": Decimal("1.10")}, "JSON", id="decimal"),
    pytest.param(b"raw bytes", "JSON", id="bytes"),
    pytest.param(_circular(), "JSON", id="circular"),
    pytest.param({"name": "nul\x00inside"}, r"input\['name'\] contains a NUL", id="nul-in-value"),
    pytest.param({"nul\x00key": 1}, "a key of input contains a NUL", id="nul-in-key"),
    pytest.param(["\ud800"], r"input\[0\] is not valid Unicode", id="lone-surrogate"),
    pytest.param({1: "a", "1": "b"}, "keys must be strings", id="int-key"),
    pytest.param({None: 1}, "keys must be strings", id="none-key"),
    pytest.param({"n": 2**63}, "outside 64 bits", id="int-above-64-bits"),
    pytest.param(-(2**63) - 1, "outside 64 bits", id="int-below-64-bits"),
    pytest.param(_nested(MAX_JSON_DEPTH + 1), "nested more than", id="too-deep"),
    pytest.param(_nested(5000), "nested more than", id="far-too-deep"),
]


@on_postgres
@pytest.mark.parametrize(("value", "message"), UNSTORABLE)
async def test_unstorable_input_is_refused_and_no_table_changes(
    client: Client, state: SqlAlchemyStateAdapter, value: Any, message: str
) -> None:
    await client.start_chain("existing", {"keep": True}, dedup_key="k")
    before = await _snapshot(state)
    with pytest.raises(InvalidInputError, match=message):
        await client.start_chain("t", value)
    with pytest.raises(InvalidInputError, match=message):
        await client.start_chains([ChainSpec("t", {"fine": 1}), ChainSpec("t", value)])
    assert await _snapshot(state) == before


@every_driver
@pytest.mark.parametrize(("value", "message"), UNSTORABLE[:3] + UNSTORABLE[8:10])
async def test_unstorable_output_from_application_code_is_refused(
    client: Client, state: SqlAlchemyStateAdapter, value: Any, message: str
) -> None:
    chain = await client.start_chain("approval", {"id": 7})
    before = await _snapshot(state)
    with pytest.raises(InvalidInputError, match=message.replace("input", "output")):
        await client.complete_chain(chain.id, value)
    assert await _snapshot(state) == before


@on_postgres
@pytest.mark.parametrize("bad", ["chain\x00id", "\ud800"], ids=["nul", "lone-surrogate"])
async def test_reads_and_chain_actions_with_an_unusable_id_or_name_touch_no_database(
    client: Client, engine: AsyncEngine, bad: str
) -> None:
    """Postgres would fail such a call inside the driver (``DataError``, or an encoding
    error); it is refused up front as ``InvalidInputError`` and sends no statement."""
    statements: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    calls = [
        lambda: client.get_chain(bad),
        lambda: client.get_job(bad),
        lambda: client.list_chains(type_name=bad),
        lambda: client.list_jobs(chain_id=bad),
        lambda: client.list_jobs(type_name=bad),
        lambda: client.count_jobs(type_names=[bad]),
        lambda: client.trigger_chain(bad),
        lambda: client.cancel_chain(bad),
        lambda: client.complete_chain(bad),
        lambda: client.delete_chain(bad),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError):
            await call()
    assert statements == []


@every_driver
async def test_the_largest_accepted_values_round_trip_unchanged(client: Client) -> None:
    """The limits are where the databases' limits are, not lower: everything just
    inside them is stored and read back equal."""
    value = {
        "ints": [2**63 - 1, -(2**63), 0],
        "floats": [0.1, -2.5e-300, 1.7976931348623157e308, -0.0],  # the last two: see same_json
        "text": "emoji 🎉, accents é, CJK 漢字, control \x01\x1f, quote ' \" \\",
        "deep": _nested(MAX_JSON_DEPTH - 1),
        "tuple": (1, "two"),  # stored as a list
    }
    type_name = "é" * MAX_TYPE_NAME_LENGTH  # 400 bytes in UTF-8; the limit counts characters
    dedup_key = "🔑" * MAX_DEDUP_KEY_LENGTH
    chain = await client.start_chain(
        type_name, value, dedup_key=dedup_key, priority=2**31 - 1, max_attempts=2**31 - 1
    )
    record = await client.get_chain(chain.id)
    assert record.type_name == type_name
    assert same_json(value, record.last_job.input)
    assert record.last_job.deduplication_key == dedup_key
    assert record.last_job.priority == 2**31 - 1
    again = await client.start_chain(type_name, None, dedup_key=dedup_key)
    assert again.deduplicated
    assert again.id == chain.id


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type_name": "x" * (MAX_TYPE_NAME_LENGTH + 1)}, "type_name is 201 characters"),
        ({"type_name": "send\x00email"}, "type_name contains a NUL"),
        ({"type_name": "send\udcffemail"}, "type_name is not valid Unicode"),
        ({"dedup_key": "k" * (MAX_DEDUP_KEY_LENGTH + 1)}, "dedup_key is 256 characters"),
        ({"dedup_key": "order\x00"}, "dedup_key contains a NUL"),
        ({"delay": -0.001}, "delay must be"),
        ({"delay": 1e12}, "delay is 1000000000000.0 seconds; the limit"),
        ({"dedup_key": "k", "dedup_window": 1e300}, "dedup_window is 1e[+]300 seconds"),
        ({"dedup_key": "k", "dedup_window": -1}, "dedup_window must be"),
        ({"priority": 2**31}, "priority must be an int from"),
        ({"priority": -(2**31) - 1}, "priority must be an int from"),
        ({"priority": 1.5}, "priority must be an int"),
        ({"max_attempts": 2**31}, "max_attempts must be None or an int from 1"),
        ({"max_attempts": True}, "max_attempts must be None or an int"),
        (
            {"run_at": datetime.min.replace(tzinfo=timezone(timedelta(hours=2)))},
            "outside the years 1 to 9999",
        ),
        ({"blockers": ["chain\x00id"]}, "blocker chain id contains a NUL"),
    ],
)
@both_databases
async def test_one_bad_spec_in_a_batch_writes_nothing_and_publishes_nothing(
    client: Client,
    state: SqlAlchemyStateAdapter,
    notify: NotifyAdapter,
    kwargs: dict[str, Any],
    message: str,
) -> None:
    await client.start_chain("existing", {"keep": True}, dedup_key="k")
    await wait_for_notifications()  # its wakeup is out before we listen
    heard = Recorder()
    await notify.listen_job_scheduled(["t", "existing"], heard)
    before = await _snapshot(state)
    good = ChainSpec("t", {"n": 1})
    batch = [good, replace(good, **kwargs), replace(good, input={"n": 3})]
    with pytest.raises(InvalidInputError, match=message):
        await client.start_chains(batch)
    assert await _snapshot(state) == before
    await asyncio.sleep(0.05)  # an in-process notification would have arrived by now
    assert heard.calls == []


@every_driver
async def test_an_unknown_blocker_in_a_batch_writes_nothing(
    client: Client, state: SqlAlchemyStateAdapter
) -> None:
    """Found out inside the transaction (it needs a read), which then rolls back."""
    blocker = await client.start_chain("existing", {"keep": True})
    before = await _snapshot(state)
    batch = [
        ChainSpec("t", {"n": 1}, dedup_key="first"),
        ChainSpec("t", {"n": 2}, blockers=[blocker.id, "0" * 32]),
    ]
    with pytest.raises(ChainNotFoundError, match=r"0{32} do not exist"):
        await client.start_chains(batch)
    assert await _snapshot(state) == before


async def test_start_chains_refuses_what_is_not_a_list_of_specs(client: Client) -> None:
    with pytest.raises(InvalidInputError, match="list of ChainSpec"):
        await client.start_chains(ChainSpec("t"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="ChainSpec items"):
        await client.start_chains([ChainSpec("t"), ("t", {})])  # type: ignore[list-item]
    assert sum((await client.count_jobs()).values()) == 0


# -- what handlers hand back ------------------------------------------------------------


# What a handler returns on its first attempt, and what the recorded error says.
BAD_OUTPUTS: dict[str, tuple[Callable[[JobContext], Any], str]] = {
    "nan": (lambda ctx: {"ratio": math.nan}, "output must be JSON-serializable"),
    "infinity": (lambda ctx: math.inf, "output must be JSON-serializable"),
    "datetime": (lambda ctx: {"at": datetime.now(UTC)}, "not JSON serializable"),
    "nul": (lambda ctx: {"name": "a\x00b"}, "contains a NUL character"),
    "int-key": (lambda ctx: {1: "one"}, "keys must be strings"),
    "huge-int": (lambda ctx: 10**30, "outside 64 bits"),
    "continue-with-nan": (
        lambda ctx: ctx.continue_with("next", {"x": math.nan}),
        "input must be JSON-serializable",
    ),
}


@on_postgres
@pytest.mark.parametrize("mode", ["atomic", "staged"])
@pytest.mark.parametrize("bad", sorted(BAD_OUTPUTS))
async def test_unstorable_output_fails_its_chain_at_once_and_nothing_else(
    client: Client, state: SqlAlchemyStateAdapter, mode: Any, bad: str
) -> None:
    """Output that cannot be stored fails the same way on every attempt: the chain
    fails at once (not after 20 attempts over hours) with the message, the row keeps
    its input and no output, and jobs completing alongside (one batch in staged mode)
    are not affected."""
    attempts: list[int] = []
    make_output, error = BAD_OUTPUTS[bad]

    async def handler(job: Job, ctx: JobContext) -> Any:
        if job.input["bad"]:
            attempts.append(job.attempt)
            return make_output(ctx)
        return {"done": job.input["n"]}

    good = [await client.start_chain("work", {"n": n, "bad": False}) for n in range(4)]
    chain = await client.start_chain("work", {"n": 9, "bad": True})  # 20 attempts allowed
    async with Worker(client, {"work": handler}, mode=mode, retry_backoff=lambda _: 0.01):
        done = await client.await_chain(chain.id, timeout=10)
        for other in good:
            assert (await client.await_chain(other.id, timeout=10)).status == "completed"
    assert attempts == [1]
    assert done.status == "failed"
    assert done.output is None
    assert done.last_job.input == {"n": 9, "bad": True}
    assert done.last_job.chain_index == 0  # no continuation was written
    assert error in (done.last_job.last_error or "")


@every_driver
async def test_unstorable_output_on_the_last_attempt_fails_the_chain_cleanly(
    client: Client,
) -> None:
    async def handler(job: Job, ctx: JobContext) -> Any:
        return {"ratio": math.nan}

    chain = await client.start_chain("work", {"keep": "me"}, max_attempts=1)
    async with Worker(client, {"work": handler}):
        done = await client.await_chain(chain.id, timeout=10)
    assert done.status == "failed"
    assert done.output is None
    assert done.last_job.input == {"keep": "me"}
    assert "the handler's output must be JSON-serializable" in (done.last_job.last_error or "")


# -- a type no worker handles -----------------------------------------------------------


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "250"}).invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@both_databases
async def test_a_type_no_worker_handles_stays_pending_and_visible_in_the_cli(
    client: Client, database_url: str, table_prefix: str
) -> None:
    seen: list[str] = []

    async def handler(job: Job, ctx: JobContext) -> None:
        seen.append(job.type_name)

    orphan = await client.start_chain("nobody-handles-this", {"lost": False})
    known = [await client.start_chain("known", None) for _ in range(3)]
    # A fast poll and fresh notifications for the orphan's type: the worker still
    # asks SQL only for its own types.
    async with Worker(client, {"known": handler}, poll_interval=0.05):
        for chain in known:
            await client.await_chain(chain.id, timeout=10)
        for _ in range(5):
            await client.notify.notify_jobs_scheduled({"nobody-handles-this": 1})
            await asyncio.sleep(0.05)
    assert seen == ["known"] * 3
    job = (await client.get_chain(orphan.id)).last_job
    assert (job.status, job.attempt, job.leased_by) == ("pending", 0, None)

    common = ("--database-url", database_url, "--table-prefix", table_prefix)
    code, listed = await asyncio.to_thread(_cli, "chains", "list", *common, "--status", "pending")
    assert code == 0, listed
    assert orphan.id in listed
    assert "nobody-handles-this" in listed
    assert all(chain.id not in listed for chain in known)
    code, shown = await asyncio.to_thread(_cli, "chains", "show", *common, orphan.id)
    assert code == 0, shown
    assert "pending" in shown
    assert "0/20" in shown  # never attempted, 20 attempts by default


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mysql://app:s3cret@db.example/jobs", "No module named"),
        ("postgresql+pg8000://app:s3cret@db.example/jobs", "No module named"),
        ("sqlite+pysqlite:///jobs.db", "requires an async driver"),
        ("redis://app:s3cret@127.0.0.1:6379/0", "redis"),
        ("not a url at all", "Could not parse"),
    ],
)
def test_the_cli_refuses_an_unsupported_database_url_without_a_traceback(
    url: str, reason: str
) -> None:
    result = CliRunner().invoke(cli, ["chains", "list", "--database-url", url])
    assert result.exit_code == 2  # a usage error, like click's own
    assert "ConfigurationError: unsupported database URL" in result.output
    assert reason in result.output
    assert "postgresql+psycopg://" in result.output  # says what to use instead
    assert "s3cret" not in result.output
    assert result.exc_info is None or result.exc_info[0] is SystemExit


class _OtherAsyncDialect(SQLiteDialect_aiosqlite):
    """A working async driver for a dialect the state adapter does not support."""

    name = "mssql"
    driver = "otherasync"


async def test_the_state_adapter_refuses_an_unsupported_dialect_naming_it() -> None:
    registry.register("mssql.otherasync", __name__, "_OtherAsyncDialect")
    engine = create_async_engine("mssql+otherasync:///jobs.db")
    try:
        with pytest.raises(
            ConfigurationError, match=r"unsupported database mssql\+otherasync"
        ) as e:
            SqlAlchemyStateAdapter(engine)
        assert "postgresql+psycopg://" in str(e.value)
    finally:
        await engine.dispose()


# -- wake hints and payloads, on every adapter ------------------------------------------

HINT_KINDS = ["noop", "in_process", "redis", "postgres", "nats"]


def _adapter(kind: str, request: pytest.FixtureRequest, prefix: str) -> NotifyAdapter:
    if kind == "noop":
        return NoopNotifyAdapter()
    if kind == "in_process":
        return InProcessNotifyAdapter()
    if kind == "redis":
        return RedisNotifyAdapter(request.getfixturevalue("redis_url"), prefix=prefix)
    if kind == "postgres":
        return PostgresNotifyAdapter(request.getfixturevalue("postgres_url"), prefix=prefix)
    return NatsNotifyAdapter(request.getfixturevalue("nats_url"), prefix=prefix)


@pytest.mark.parametrize("kind", HINT_KINDS)
@pytest.mark.parametrize("count", [-1, 1.5, True, "3", None])
async def test_a_bad_hint_count_is_refused_and_changes_no_budget(
    kind: str, count: Any, request: pytest.FixtureRequest, prefix: str
) -> None:
    async with _adapter(kind, request, prefix) as adapter:
        try:
            heard = Recorder()
            await adapter.listen_job_scheduled(["a", "b"], heard)
            await adapter.provide_wake_hint("a", 1)
            with pytest.raises(InvalidInputError, match="wake hint count must be an int >= 0"):
                await adapter.provide_wake_hint("a", count)
            with pytest.raises(InvalidInputError, match="wake hint count must be an int >= 0"):
                await adapter.notify_jobs_scheduled({"a": 1, "b": count})
            # Still the one unit provided first (adapters with budgets), and nothing
            # was announced: the good half of the batch was not sent either.
            assert await adapter.consume_wake_hint("a") is True
            if kind in ("in_process", "redis", "nats"):
                assert await adapter.consume_wake_hint("a") is False
            await asyncio.sleep(0.1)
            assert heard.calls == []
        finally:
            await delete_notify_state(kind, request, prefix)


@pytest.mark.parametrize("kind", ["in_process", "redis", "postgres", "nats"])
@pytest.mark.parametrize(
    "name",
    ["", "nul\x00", "lone\udc80surrogate", "x" * (MAX_PAYLOAD_BYTES + 1), 42],
    ids=["empty", "nul", "surrogate", "oversized", "not-a-string"],
)
async def test_a_payload_no_receiver_would_accept_is_refused_before_publishing(
    kind: str, name: Any, request: pytest.FixtureRequest, prefix: str
) -> None:
    async with _adapter(kind, request, prefix) as adapter:
        try:
            for call in (
                lambda: adapter.notify_job_scheduled(name),
                lambda: adapter.notify_chain_completed(name),
                lambda: adapter.notify_job_ownership_lost(name),
                lambda: adapter.provide_wake_hint(name, 1),
                lambda: adapter.notify_jobs_scheduled({"ok": 1, name: 1}),
            ):
                with pytest.raises(InvalidInputError, match=r"the (type name|chain id|job id)"):
                    await call()
        finally:
            await delete_notify_state(kind, request, prefix)


async def test_a_payload_of_exactly_the_limit_is_delivered(redis_url: str, prefix: str) -> None:
    name = "é" * (MAX_PAYLOAD_BYTES // 2)  # 1024 bytes in UTF-8
    async with RedisNotifyAdapter(redis_url, prefix=prefix) as adapter:
        heard = Recorder()
        await adapter.listen_job_scheduled([name], heard)
        await adapter.notify_job_scheduled(name)
        await heard.wait_for(1, within=5.0)
        assert heard.calls == [(name,)]
        assert adapter.ignored_messages == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be an int > 0, got 0"),
        ({"concurrency": True}, "concurrency must be an int > 0, got True"),
        ({"completion_batch_size": 2.5}, "completion_batch_size must be an int > 0"),
        ({"poll_interval": -1}, "poll_interval must be a finite number of seconds > 0"),
        ({"lease": math.inf}, "lease must be a finite number of seconds > 0"),
        ({"drain_timeout": math.nan}, "drain_timeout must be a finite number of seconds >= 0"),
        ({"handler_timeout": 0}, "handler_timeout must be a finite number of seconds > 0"),
        ({"reap_interval": "1"}, "reap_interval must be a finite number of seconds > 0"),
    ],
)
def test_worker_settings_are_checked_at_construction(
    client: Client, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        Worker(client, {"t": lambda job, ctx: None}, **options)
