"""Shared fixtures: service URLs (session scope) and private servers (function scope)."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.alone import ALONE_GROUP, RunLock, is_alone
from tests.support.redis_cluster import LocalRedisCluster, local_redis_cluster
from tests.support.services import OwnServer, own_nats_server, own_redis_server, provide_service

TIMING_RERUNS = 1
"""A test marked ``timing`` exists to check a latency bound; a loaded machine may break
one run of it, so it runs once more before it counts as failed. No other test is re-run:
a lost, doubled or wrong result is a failure the first time."""


CLUSTER_NOTIFY_KINDS = ("redis_cluster", "redis_cluster_lists")

_RUN_LOCK = pytest.StashKey[RunLock | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RUN_LOCK] = RunLock.of_this_run(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(_RUN_LOCK, None)
    if lock is not None:
        lock.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under xdist, each test waits for its turn (``tests/support/alone.py``) before
    its fixtures, its timeout and its re-runs begin."""
    lock = item.config.stash.get(_RUN_LOCK, None)
    if lock is not None:
        lock.before(alone=is_alone(item))
    try:
        yield
    finally:
        if lock is not None:
            lock.after(keep=is_alone(item) and is_alone(nextitem))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_alone(item):
            # xdist joins every group a test is in: an alone test must be in no other.
            assert not item.get_closest_marker("xdist_group"), f"{item.nodeid}: alone in a group"
            item.add_marker(pytest.mark.xdist_group(ALONE_GROUP))
        elif (group := _cluster_group(item)) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return  # a venv without pytest-rerunfailures (the Django 6 run): no re-runs
    for item in items:
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=TIMING_RERUNS))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected heap is frozen; and under ``--dist loadgroup`` xdist marks each
    grouped test's id with its group: a pytest whose ids it cannot change (9.2,
    pytest-dev/pytest-xdist#1386) would run the groups' tests side by side, silently:
    refused instead."""
    _freeze_the_heap()
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group")]
    if lost and not any("@" in nodeid for nodeid in lost):
        raise pytest.UsageError(
            f"xdist_group has no effect with pytest {pytest.__version__} "
            "(pytest-dev/pytest-xdist#1386): install the dev extra's pytest"
        )


def _freeze_the_heap() -> None:
    """``gc.freeze()`` what imports and collection made: ~120k objects that live until
    the end, which every full collection of Python's garbage collector walked (27 full
    collections of ~170 ms each in a 73 s run of three modules; ~75 ms frozen)."""
    gc.collect()
    gc.freeze()


def _cluster_group(item: pytest.Item) -> str | None:
    """The xdist group of a test on the module's ``redis_cluster`` (module scope: six
    servers started and settled): one per module, so that under ``--dist loadgroup`` one
    worker starts it, as a serial run does, instead of every worker a test lands on."""
    callspec = getattr(item, "callspec", None)
    notify_kind = callspec.params.get("notify_kind") if callspec is not None else None
    fixturenames: list[str] = getattr(item, "fixturenames", [])
    if "redis_cluster" in fixturenames or notify_kind in CLUSTER_NOTIFY_KINDS:
        return f"redis_cluster:{item.nodeid.split('::', 1)[0]}"
    return None


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with provide_service("redis") as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with provide_service("postgres") as url:
        yield url


ASYNC_POSTGRES_DRIVERS = ["psycopg", "asyncpg"]
SYNC_POSTGRES_DRIVERS = ["psycopg", "psycopg2"]


def with_driver(url: str, driver: str) -> str:
    """``url`` (a Postgres URL) with SQLAlchemy driver ``driver``."""
    return str(make_url(url).set(drivername=f"postgresql+{driver}").render_as_string(False))


@pytest.fixture(params=ASYNC_POSTGRES_DRIVERS)
def async_postgres_url(postgres_url: str, request: pytest.FixtureRequest) -> str:
    """The test Postgres through each async driver the queue accepts."""
    return with_driver(postgres_url, request.param)


@pytest.fixture(params=SYNC_POSTGRES_DRIVERS)
def sync_postgres_url(postgres_url: str, request: pytest.FixtureRequest) -> str:
    """The test Postgres through each sync driver ``SyncClient`` accepts."""
    return with_driver(postgres_url, request.param)


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    with provide_service("nats") as url:
        yield url


@pytest.fixture
def prefix() -> str:
    """A prefix of this test's own, so tests never see each other's keys or channels."""
    return f"qt{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[OwnServer]:
    """A redis-server only this test uses; it may be killed and restarted."""
    yield from own_redis_server(tmp_path)


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[OwnServer]:
    """A nats-server (JetStream) only this test uses; it may be killed and restarted."""
    yield from own_nats_server(tmp_path)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """A local Redis Cluster (3 masters + 3 replicas) of this test module's own; tests
    may kill, restart and reshard it, and leave it settled for the next test."""
    yield from local_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))


@pytest.fixture
def cluster(redis_cluster: LocalRedisCluster, prefix: str) -> Iterator[LocalRedisCluster]:
    """The module's ``redis_cluster``; afterwards the faults this test left are undone
    (paused nodes resumed, killed ones restarted) and its keys deleted."""
    yield redis_cluster
    redis_cluster.settle(prefix)
