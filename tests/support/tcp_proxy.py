"""A TCP proxy in front of a real server, for tests that break the network between a
client and that server without touching the server itself."""

from __future__ import annotations

import asyncio
from typing import Literal
from urllib.parse import urlsplit

Mode = Literal["forward", "reset", "blackhole"]


class TcpProxy:
    """Forwards loopback connections to ``target``; a test switches it to fail as a
    network or a server does:

    - :meth:`refuse`: stops listening and drops every open link, so connecting fails
      with "connection refused" (a server down or restarting) until :meth:`restore`;
    - ``mode = "reset"``: accepts and closes at once (counted in ``reset``, timed in
      ``reset_times``), as a server that is going away does;
    - ``mode = "blackhole"``: accepts and forwards nothing either way, and open links
      go silent too (a hung server or a partitioned network).

    ``delay`` seconds (0: none) hold up every chunk either way, as a remote server's
    round trip does.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._mode: Mode = "forward"
        self.reset = 0
        self.reset_times: list[float] = []  # loop.time() of each connection reset
        self.delay = 0.0
        self.port = 0

    @classmethod
    async def in_front_of(cls, url: str) -> TcpProxy:
        target = urlsplit(url)
        proxy = cls(target.hostname or "127.0.0.1", target.port or 0)
        await proxy.start()
        return proxy

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        target = urlsplit(url)
        return url.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{self.port}", 1)

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._mode = mode
        if mode == "forward":
            self._flowing.set()
        else:
            self._flowing.clear()
        if mode == "reset":
            self.drop_links()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> None:
        """Stop listening and drop every open link: new connections are refused."""
        await self._stop_listening()
        self.drop_links()

    async def restore(self) -> None:
        """Listen again on the same port and forward."""
        self.mode = "forward"
        if self._server is None:
            await self.start()

    def drop_links(self) -> None:
        for writer in list(self._links):
            writer.close()
        self._links.clear()

    async def close(self) -> None:
        await self._stop_listening()
        self.drop_links()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._mode == "reset":
            self.reset += 1
            self.reset_times.append(asyncio.get_running_loop().time())
            writer.close()
            return
        self._links.add(writer)
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._links.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()
