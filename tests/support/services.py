"""Where the test services are, and what happens when one is missing.

Each service is looked for at its ``QUEUERT_TEST_*_URL`` (or the default on
this machine). When nothing answers there and a Docker engine is available,
testcontainers starts one. When neither, the test is skipped with the reason
— except under ``CI=true``, where a missing service fails the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from benchmarks.services import free_port, wait_for_port

DEFAULT_URLS = {
    "redis": "redis://127.0.0.1:6379/0",
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "nats": "nats://127.0.0.1:4222",
}


def service_url(name: str) -> str:
    return os.environ.get(f"QUEUERT_TEST_{name.upper()}_URL", DEFAULT_URLS[name])


def _answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 1.0):
            return True
    except OSError:
        return False


def _docker_available() -> bool:
    with suppress(Exception):
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    return False


def _start_container(name: str) -> tuple[str, Callable[[], None]]:
    if name == "redis":
        from testcontainers.redis import RedisContainer

        redis = RedisContainer("redis:7")
        redis.start()
        url = f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0"
        return url, redis.stop
    if name == "postgres":
        from testcontainers.postgres import PostgresContainer

        pg = PostgresContainer("postgres:15", driver="psycopg")
        pg.start()
        return pg.get_connection_url(), pg.stop
    from testcontainers.core.container import DockerContainer

    nats = DockerContainer("nats:2.10").with_command("-js").with_exposed_ports(4222)
    nats.start()
    return f"nats://{nats.get_container_host_ip()}:{nats.get_exposed_port(4222)}", nats.stop


@contextmanager
def provide_service(name: str) -> Iterator[str]:
    """Yield a URL where service ``name`` answers, or skip / fail as described above."""
    url = service_url(name)
    if _answers(url):
        yield url
        return
    if _docker_available():
        url, stop = _start_container(name)
        try:
            yield url
        finally:
            stop()
        return
    reason = f"{name} is not reachable at {url} and no Docker engine is available"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(reason)


@dataclass
class OwnServer:
    """A server process this test owns: it may stop, kill and restart it at will."""

    argv: list[str]
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "redis" if "redis" in self.argv[0] else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = (self.workdir / "server.log").open("ab")
        self.process = subprocess.Popen(self.argv, cwd=self.workdir, stdout=log, stderr=log)
        wait_for_port(self.port, self.process)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


def _own_server(binary: str, argv: list[str], port: int, workdir: Path) -> Iterator[OwnServer]:
    if shutil.which(binary) is None:
        reason = f"{binary} is not installed; this test starts and kills its own server"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    server = OwnServer([binary, *argv], port, workdir)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def own_redis_server(workdir: Path, *extra: str) -> Iterator[OwnServer]:
    """A private redis-server on a free loopback port (never the shared one)."""
    port = free_port()
    argv = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    yield from _own_server("redis-server", [*argv, *extra], port, workdir)


def own_nats_server(workdir: Path, *extra: str) -> Iterator[OwnServer]:
    """A private nats-server with JetStream on a free loopback port."""
    port = free_port()
    argv = ["-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "js"), *extra]
    yield from _own_server("nats-server", argv, port, workdir)
