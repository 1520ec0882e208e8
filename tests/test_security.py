"""Security: bound SQL parameters, Redis confined to its prefix, ACL users and TLS,
and no credentials in logs or exceptions.

Every Redis test starts a private redis-server; the shared one is never touched.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import subprocess
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from queuert_notify import (
    ConfigurationError,
    NatsNotifyAdapter,
    PostgresNotifyAdapter,
    RedisNotifyAdapter,
)
from queuert_notify.cli import main as cli
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.jobs import Job, JobContext
from queuert_notify.notify.redis.adapter import WakeMode
from queuert_notify.testing import Recorder
from queuert_notify.worker.worker import Worker
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter
from tests.support.queue_helpers import STATE_KINDS, tasks_shown_after
from tests.support.services import OwnServer, free_port, own_redis_server

pytest_plugins = ["tests.support.queue_fixtures"]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "notify-adapters.md"


# -- SQL: values only ever travel as bound parameters -------------------------------------


def _hostile(marker: str, table_prefix: str) -> list[str]:
    """Strings that break SQL built by concatenation; each carries ``marker``."""
    return [
        f"{marker}'; DROP TABLE {table_prefix}jobs; --",
        f'{marker}"; DELETE FROM {table_prefix}chains; --',
        f"{marker}') OR ('1'='1",
        f"{marker} %s %(x)s :name $1 ? {{0}} \\' \\\" `x` /* */",
        f"{marker}\\'; SELECT pg_sleep(10); --",
    ]


@pytest.mark.parametrize("state_kind", STATE_KINDS, indirect=True)
async def test_hostile_text_travels_only_as_bound_parameters_and_round_trips(
    client: Client, engine: AsyncEngine, table_prefix: str, database_url: str
) -> None:
    marker = f"mk{uuid.uuid4().hex[:8]}"
    hostile = _hostile(marker, table_prefix)
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        await _hostile_workload(client, hostile)
        # Reading back filters by the same strings.
        for name in hostile:
            listed = (await client.list_chains(type_name=name)).items
            assert listed
            assert {chain.type_name for chain in listed} == {name}
            assert (await client.count_jobs(type_names=[name])).get("completed", 0) >= 1
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)

    assert statements, "the listener saw the workload's SQL"
    leaked = [s for s in statements if marker in s]
    assert leaked == [], f"a value was pasted into SQL: {leaked[0]!r}"

    # The CLI filters with them too (its own engine, the same adapter code).
    (only,) = (await client.list_chains(type_name=hostile[0])).items
    code, output = await asyncio.to_thread(
        _cli, "chains", "list", "--database-url", database_url, "--table-prefix", table_prefix,
        "--type", hostile[0], "--limit", "1000",
    )  # fmt: skip
    assert code == 0, output
    assert only.id in output


async def _hostile_workload(client: Client, hostile: list[str]) -> None:
    """Every write and read of a chain's life, with ``hostile`` as type names, dedup
    keys, inputs, outputs, progress, error messages and the worker id."""
    handlers: dict[str, Any] = {}
    for index, name in enumerate(hostile):
        follow = f"{name} (next)"

        async def first(job: Job, ctx: JobContext, name: str = name, follow: str = follow) -> Any:
            if job.attempt == 1:
                raise RuntimeError(name)  # recorded as last_error
            await ctx.set_progress({name: name})
            return ctx.continue_with(follow, {name: job.input[name]})

        async def second(job: Job, ctx: JobContext, name: str = name) -> Any:
            return {name: [name, job.input[name]]}

        handlers[name], handlers[follow] = first, second
        chain = await client.start_chain(name, {name: index}, dedup_key=name)
        again = await client.start_chains([ChainSpec(name, {name: -1}, dedup_key=name)])
        assert again[0].deduplicated and again[0].id == chain.id

    worker_id = hostile[0][:200]
    async with Worker(client, handlers, worker_id=worker_id, retry_backoff=lambda _: 0.01):
        for index, name in enumerate(hostile):
            chain_id = (await client.list_chains(type_name=name)).items[0].id
            done = await client.await_chain(chain_id, timeout=20)
            assert done.status == "completed", done
            assert done.output == {name: [name, index]}
            jobs = (await client.list_jobs(chain_id=chain_id)).items
            first_job = next(job for job in jobs if job.chain_index == 0)
            assert first_job.type_name == name
            assert first_job.deduplication_key == name
            assert first_job.input == {name: index}
            assert first_job.progress == {name: name}
            assert name in (first_job.last_error or "")
            assert first_job.leased_by in (None, worker_id)

    # Application-side completion and cancellation with the same strings.
    manual = await client.start_chain(hostile[1], {"manual": True})
    done = await client.complete_chain(manual.id, {hostile[2]: hostile[3]})
    assert done.output == {hostile[2]: hostile[3]}
    cancelled = await client.cancel_chain((await client.start_chain(hostile[4], None)).id)
    assert cancelled.status == "cancelled"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


# -- private Redis servers ----------------------------------------------------------------


def _documented_acl_rules(prefix: str, password: str) -> list[str]:
    """The ACL line of docs/notify-adapters.md, for ``prefix`` and ``password``."""
    match = re.search(r"^user queuert (.+)$", DOCS.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "docs/notify-adapters.md documents the adapter's ACL user"
    rules = match.group(1).replace("queuert:", f"{prefix}:").replace("CHANGE-ME", password)
    return rules.split()


def _documented_lists_acl_rules() -> list[str]:
    """What docs/notify-adapters.md adds to the user for ``wake="lists"``."""
    pattern = r"^\s*ACL SETUSER queuert (\+.+)$"
    match = re.search(pattern, DOCS.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "docs/notify-adapters.md documents what wake='lists' adds to the ACL user"
    return match.group(1).split()


def _documented_acl_commands() -> set[str]:
    return {rule[1:].upper() for rule in _documented_acl_rules("p", "x") if rule.startswith("+")}


@contextmanager
def _redis(tmp_path: Path, *extra: str) -> Iterator[OwnServer]:
    yield from own_redis_server(tmp_path, *extra)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed; the TLS tests make their certificates with it")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=queuert test CA", cwd=directory)  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=directory)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "1",
                 "-extfile", "san.cnf", cwd=directory)  # fmt: skip
    return {name: directory / name for name in ("ca.crt", "server.crt", "server.key",
                                                "client.crt", "client.key")}  # fmt: skip


@contextmanager
def _tls_redis(tmp_path: Path, *extra: str, client_certificates: bool = False) -> Iterator[int]:
    """A private redis-server listening only with TLS; yields its port."""
    certs = _make_certificates(tmp_path)
    port = free_port()
    server = OwnServer(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no",
         "--tls-cert-file", str(certs["server.crt"]), "--tls-key-file", str(certs["server.key"]),
         "--tls-ca-cert-file", str(certs["ca.crt"]),
         "--tls-auth-clients", "yes" if client_certificates else "no", *extra],
        port, tmp_path,
    )  # fmt: skip
    log = (tmp_path / "server.log").open("ab")
    server.process = subprocess.Popen(server.argv, cwd=tmp_path, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while not _port_open(port):
            if server.process.poll() is not None:
                output = (tmp_path / "server.log").read_text(errors="replace")
                if "TLS" in output or "tls" in output:
                    pytest.skip(f"this redis-server build has no TLS support: {output[-300:]}")
                pytest.fail(f"redis-server with TLS did not start: {output[-500:]}")
            if time.monotonic() > deadline:
                pytest.fail("redis-server with TLS did not listen within 10 s")
            time.sleep(0.02)
        yield port
    finally:
        server.kill()


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@asynccontextmanager
async def _queue(notify: RedisNotifyAdapter, tmp_path: Path) -> AsyncIterator[Client]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    try:
        state = SqlAlchemyStateAdapter(engine, table_prefix="sec_")
        await state.migrate()
        async with Client(state=state, notify=notify) as client:
            yield client
    finally:
        await engine.dispose()


# Type names that would escape a key or channel built carelessly.
STRANGE_TYPES = ("send:{mail}*?[x]", 'next ../step \\ "q"')


async def _redis_workload(notify: RedisNotifyAdapter, tmp_path: Path) -> None:
    """Everything the adapter does for a queue: budgets, wakeups, chain-completed waits,
    blockers, continuations and an ownership-lost cancel, with a 60 s poll so the
    wakeups must arrive through Redis."""
    first, second = STRANGE_TYPES
    slow_started = asyncio.Event()

    async def start(job: Job, ctx: JobContext) -> Any:
        return ctx.continue_with(second, job.input)

    async def finish(job: Job, ctx: JobContext) -> Any:
        return job.input

    async def slow(job: Job, ctx: JobContext) -> None:
        slow_started.set()
        await asyncio.Event().wait()  # until its job is cancelled

    handlers = {first: start, second: finish, "slow": slow}
    # Bounded below pytest-timeout, so a step that hangs fails with its own traceback.
    async with (
        tasks_shown_after(50),
        asyncio.timeout(60),
        _queue(notify, tmp_path) as client,
        Worker(client, handlers, poll_interval=60.0, concurrency=4),
    ):
        await asyncio.sleep(0.2)  # the worker's first poll is over: wakeups from here on
        chains = [await client.start_chain(first, n) for n in range(3)]
        blocked = await client.start_chain(second, "after", blockers=[chains[0].id])
        for n, chain in enumerate(chains):
            done = await client.await_chain(chain.id, timeout=20)
            assert (done.status, done.output) == ("completed", n)
        assert (await client.await_chain(blocked.id, timeout=20)).output == "after"
        doomed = await client.start_chain("slow", None)
        await asyncio.wait_for(slow_started.wait(), 20)
        assert (await client.cancel_chain(doomed.id)).status == "cancelled"


_MONITOR_LINE = re.compile(r"^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$", re.DOTALL)
_QUOTED = re.compile(r'"((?:\\.|[^"\\])*)"')
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def _monitor_args(line: bytes) -> tuple[str, list[bytes]]:
    """(client address or "lua", arguments) of one MONITOR line; Redis quotes every
    argument and escapes unprintable bytes as \\xHH."""
    match = _MONITOR_LINE.match(line.decode("ascii"))
    assert match, line
    args = []
    for quoted in _QUOTED.findall(match.group(2)):
        out, i = bytearray(), 0
        while i < len(quoted):
            if quoted[i] == "\\" and quoted[i + 1] == "x":
                out += bytes([int(quoted[i + 2 : i + 4], 16)])
                i += 4
            elif quoted[i] == "\\":
                out += _ESCAPES[quoted[i + 1]]
                i += 2
            else:
                out += quoted[i].encode()
                i += 1
        args.append(bytes(out))
    return match.group(1), args


@asynccontextmanager
async def _monitoring(port: int) -> AsyncIterator[list[bytes]]:
    """Every command the server runs meanwhile, as raw MONITOR lines. Read from a plain
    asyncio stream: redis-py may swallow the cancellation of a read (redis-py #2028),
    which once left this reader, and the test, waiting forever."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"MONITOR\r\n")
    assert await reader.readline() == b"+OK\r\n"
    lines: list[bytes] = []

    async def read() -> None:
        # One simple-string reply a command; MONITOR escapes CR and LF inside arguments.
        while line := await reader.readline():
            lines.append(line[1:].rstrip(b"\r\n"))

    reading = asyncio.create_task(read())
    try:
        yield lines
    finally:
        await asyncio.sleep(0.2)  # the last commands reach the monitor
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        writer.close()
        await writer.wait_closed()


# Sent by redis-py while connecting, before and beside the adapter's own commands.
HANDSHAKE = {"HELLO", "AUTH", "CLIENT|SETINFO", "SELECT"}
CHANNEL_COMMANDS = {"PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE", "SPUBLISH", "PSUBSCRIBE"}


@pytest.mark.parametrize("wake", ["pubsub", "lists"])
async def test_redis_traffic_stays_under_the_prefix_and_uses_only_the_documented_commands(
    tmp_path: Path, prefix: str, wake: WakeMode
) -> None:
    with _redis(tmp_path) as server:
        admin = Redis(port=server.port)
        channels_seen: set[bytes] = set()

        sampled = asyncio.Event()

        async def sample_channels() -> None:
            # Told to stop rather than cancelled: redis-py may swallow the cancellation
            # of a command (redis-py #2028), and this loop would then never end.
            while not sampled.is_set():
                channels_seen.update(await admin.pubsub_channels())
                await asyncio.sleep(0.02)

        try:
            async with _monitoring(server.port) as lines:
                sampler = asyncio.create_task(sample_channels())
                try:
                    notify = RedisNotifyAdapter(server.url, prefix=prefix, wake=wake)
                    await _redis_workload(notify, tmp_path)
                finally:
                    sampled.set()
                    await sampler
            own = f"{prefix}:".encode()
            commands: set[str] = set()
            keys_checked = 0
            for line in lines:
                source, args = _monitor_args(line)
                name = args[0].decode().upper()
                if name in ("PUBSUB", "MONITOR"):
                    continue  # this test's own inspection
                if name in ("SCRIPT", "CLIENT"):
                    name = f"{name}|{args[1].decode().upper()}"
                commands.add(name)
                if name in CHANNEL_COMMANDS:
                    channels = args[1:2] if "PUBLISH" in name else args[1:]
                    assert all(c.startswith(own) for c in channels), (source, args)
                try:
                    keys = await admin.command_getkeys(*args)
                except ResponseError:
                    keys = []  # a command without keys
                keys = [key if isinstance(key, bytes) else key.encode() for key in keys]
                assert all(key.startswith(own) for key in keys), (source, args)
                keys_checked += len(keys)
            assert keys_checked, "the scripts' keys were seen (EVALSHA and inside Lua)"
            assert channels_seen, "channels were sampled while the workload ran"
            assert all(channel.startswith(own) for channel in channels_seen), channels_seen
            keys = [key async for key in admin.scan_iter(match="*")]
            assert keys, "the workload left wake budgets behind"
            assert all(key.startswith(own) for key in keys), keys
            # The documented ACL is what the adapter sends: enough, and nothing in it
            # goes unused (but PING, the subscriber's health check, whose timing
            # decides whether a short run sends one, and DEL, which a budget script
            # sends only to replace a poisoned budget).
            documented = _documented_acl_commands()
            if wake == "lists":
                documented |= {rule[1:].upper() for rule in _documented_lists_acl_rules()}
            assert commands - HANDSHAKE <= documented, commands - HANDSHAKE - documented
            if wake == "pubsub":
                # (Lists mode: which of its rules a short run needs varies: BLMOVE for
                # one type, the reaper's moves.)
                assert documented - commands <= {"PING", "DEL"}, documented - commands
        finally:
            await admin.aclose()


@pytest.mark.parametrize("wake", ["pubsub", "lists"])
async def test_the_documented_minimal_acl_is_enough_and_confines_the_adapter(
    tmp_path: Path, prefix: str, wake: WakeMode
) -> None:
    password = f"pw-{uuid.uuid4().hex}"
    rules = _documented_acl_rules(prefix, password)
    if wake == "lists":
        rules += _documented_lists_acl_rules()
    with _redis(tmp_path, "--user", "queuert", *rules) as server:
        url = f"redis://queuert:{password}@127.0.0.1:{server.port}/0"
        admin = Redis(port=server.port)  # the default user, for ACL LOG
        try:
            await _redis_workload(RedisNotifyAdapter(url, prefix=prefix, wake=wake), tmp_path)
            assert await admin.acl_log() == [], "no command of the workload was denied"

            # The patterns hold: the same user under another prefix is refused.
            async with RedisNotifyAdapter(url, prefix=f"{prefix}x", wake=wake) as outsider:
                with pytest.raises(NoPermissionError):
                    await outsider.notify_job_scheduled("t")
                with pytest.raises(NoPermissionError):
                    await outsider.provide_wake_hint("t", 1)
            assert await admin.keys(f"{prefix}x*") == []
        finally:
            await admin.aclose()


async def test_tls_with_an_acl_user_runs_the_queue(tmp_path: Path, prefix: str) -> None:
    password = f"pw-{uuid.uuid4().hex}"
    rules = _documented_acl_rules(prefix, password)
    with _tls_redis(tmp_path, "--user", "queuert", *rules) as port:
        ca = tmp_path / "ca.crt"
        url = f"rediss://queuert:{password}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        await _redis_workload(RedisNotifyAdapter(url, prefix=prefix), tmp_path)


async def test_tls_with_client_certificates_through_a_caller_owned_client(
    tmp_path: Path, prefix: str
) -> None:
    """The adapter's own subscriber connection copies the caller's TLS settings."""
    with _tls_redis(tmp_path, "--requirepass", "s3cret", client_certificates=True) as port:
        client = Redis(
            host="127.0.0.1",
            port=port,
            password="s3cret",
            ssl=True,
            ssl_ca_certs=str(tmp_path / "ca.crt"),
            ssl_certfile=str(tmp_path / "client.crt"),
            ssl_keyfile=str(tmp_path / "client.key"),
        )
        try:
            async with RedisNotifyAdapter(client=client, prefix=prefix) as notify:
                heard = Recorder()
                await notify.listen_job_scheduled(["t"], heard)
                await notify.notify_jobs_scheduled({"t": 1})
                await heard.wait_for(1, within=5.0)
                assert await notify.consume_wake_hint("t") is True
                assert await notify.consume_wake_hint("t") is False
        finally:
            await client.aclose()


async def test_tls_refuses_an_untrusted_server_or_a_plain_connection(
    tmp_path: Path, prefix: str
) -> None:
    with _tls_redis(tmp_path, "--requirepass", "s3cret") as port:
        untrusted = RedisNotifyAdapter(
            f"rediss://:s3cret@127.0.0.1:{port}/0", prefix=prefix, connect_timeout=3.0
        )
        with pytest.raises(ConfigurationError, match="certificate verify failed") as raised:
            await untrusted.connect()
        assert f"rediss://:***@127.0.0.1:{port}/0" in str(raised.value)
        await untrusted.close()
        plain = RedisNotifyAdapter(
            f"redis://:s3cret@127.0.0.1:{port}/0", prefix=prefix, connect_timeout=3.0
        )
        with pytest.raises(ConfigurationError, match="cannot reach Redis"):
            await plain.connect()
        await plain.close()


# -- credentials never reach logs or exceptions -----------------------------------------

Scenario = Callable[[str, Path], Awaitable[BaseException | None]]


async def _redis_wrong_password(secret: str, tmp_path: Path) -> BaseException | None:
    with _redis(tmp_path, "--user", "queuert", "on", f">{secret}-right", "+@all", "~*", "&*") as s:
        adapter = RedisNotifyAdapter(f"redis://queuert:{secret}@127.0.0.1:{s.port}/0")
        try:
            await adapter.connect()
        except ConfigurationError as exc:
            return exc
        finally:
            await adapter.close()
    pytest.fail("a wrong password was accepted")


async def _redis_outage(secret: str, tmp_path: Path) -> BaseException | None:
    """Warnings while the server is away and back; the Worker's logs included."""
    with _redis(tmp_path, "--requirepass", secret) as server:
        notify = RedisNotifyAdapter(f"redis://:{secret}@127.0.0.1:{server.port}/0")
        reconnects = Recorder()
        async with _queue(notify, tmp_path) as client, Worker(client, {"t": _noop}):
            notify.on_reconnect(reconnects)
            await asyncio.to_thread(server.kill)
            await reconnects.wait_for(1, within=10.0)
            await client.start_chain("t")  # publishing fails and is logged
            await asyncio.to_thread(server.start)
            # Restored: usually within 2 s; once, in a loaded full run, not within 20 s
            # (not reproduced alone in 40 tries) — the bound is for collecting the logs.
            await reconnects.wait_for(2, within=60.0)
    return None


async def _redis_url_with_a_bad_port(secret: str, tmp_path: Path) -> BaseException | None:
    try:
        RedisNotifyAdapter(f"redis://app:{secret}@127.0.0.1:not-a-port/0")
    except ConfigurationError as exc:
        return exc
    pytest.fail("a URL with a bad port was accepted")


async def _unreachable(adapter: Any) -> BaseException | None:
    try:
        await adapter.connect()
    except ConfigurationError as exc:
        return exc
    finally:
        await adapter.close()
    pytest.fail("connected to a port nothing listens on")


async def _postgres_unreachable(secret: str, tmp_path: Path) -> BaseException | None:
    dsn = f"postgresql://app:{secret}@127.0.0.1:{free_port()}/jobs"
    return await _unreachable(PostgresNotifyAdapter(dsn, connect_timeout=2.0))


async def _nats_token_unreachable(secret: str, tmp_path: Path) -> BaseException | None:
    url = f"nats://{secret}@127.0.0.1:{free_port()}"
    return await _unreachable(NatsNotifyAdapter(url, timeout=2.0))


async def _worker_with_redis_down(secret: str, tmp_path: Path) -> BaseException | None:
    """A worker starting while Redis is away logs a warning naming the address."""
    notify = RedisNotifyAdapter(f"redis://:{secret}@127.0.0.1:{free_port()}/0", connect_timeout=1)
    async with _queue(notify, tmp_path) as client, Worker(client, {"t": _noop}):
        await asyncio.sleep(0.2)
    return None


async def _cli_unreachable_database(secret: str, tmp_path: Path) -> BaseException | None:
    url = f"postgresql+psycopg://app:{secret}@127.0.0.1:{free_port()}/jobs"
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["chains", "list", "--database-url", url]
    )
    assert result.exit_code != 0
    assert secret not in result.output
    return result.exception


async def _noop(job: Job, ctx: JobContext) -> None:
    return None


SCENARIOS: dict[str, Scenario] = {
    "redis-wrong-password": _redis_wrong_password,
    "redis-outage": _redis_outage,
    "redis-url-with-a-bad-port": _redis_url_with_a_bad_port,
    "postgres-unreachable": _postgres_unreachable,
    "nats-token-unreachable": _nats_token_unreachable,
    "worker-with-redis-down": _worker_with_redis_down,
    "cli-unreachable-database": _cli_unreachable_database,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_credentials_never_reach_logs_or_exceptions(
    scenario: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = f"hunter2-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    raised = await SCENARIOS[scenario](secret, tmp_path)
    if scenario in ("redis-outage", "worker-with-redis-down"):
        assert any(r.levelno >= logging.WARNING for r in caplog.records), "the fault was logged"
    for record in caplog.records:
        text = record.getMessage() + repr(vars(record))
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        assert secret not in text, f"logged by {record.name}: {record.getMessage()}"
    for exc in _chain(raised):
        text = str(exc) + repr(exc) + "".join(traceback.format_exception(exc))
        assert secret not in text, f"{type(exc).__name__}: {exc}"


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
