"""What a test of a resource leak looks at: the "Unclosed ..." reports of clients the
garbage collector found still connected, and this process's own TCP connections."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_ESTABLISHED = "01"
"""The state column of an established connection in ``/proc/net/tcp``."""


@contextmanager
def unclosed_reports() -> Iterator[list[str]]:
    """Inside: every "Unclosed ..." report the running loop's exception handler gets
    (redis-py's clients and nodes report themselves that way when collected with a
    connection open); on the way out the garbage collector runs first, so what was
    dropped inside is reported. Any other report goes to the previous handler."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    reports: list[str] = []

    def record(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("Unclosed"):
            reports.append(f"{message}: {context.get('client')!r}")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(record)
    try:
        yield reports
        gc.collect()
    finally:
        loop.set_exception_handler(previous)


def connections_to(port: int) -> int:
    """How many TCP connections of this process to ``port`` (IPv4) are established, as
    the kernel sees them: it completes a connection to a server that is paused, before
    the server accepts it."""
    ours = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed since it was listed
        if target.startswith("socket:["):
            ours.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == _ESTABLISHED and int(remote.split(":")[1], 16) == port and inode in ours:
            count += 1
    return count
