"""The queue's dashboard for a ``TASKS`` backend, to mount beside Django's ASGI app.

Django's URL resolver cannot route to an ASGI app, so the dashboard is mounted one
level up, in ``asgi.py`` (``Mount("/queue", dashboard_app())`` next to
``Mount("/", get_asgi_application())``). It reads the backend's database through an
engine made from the same ``DATABASES`` entry as the worker's, and takes its live
updates from the backend's Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from django.db import connections
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.types import ASGIApp, Receive, Scope, Send

from queuert_notify.contrib.django.databases import engine_url
from queuert_notify.contrib.django.worker import backend_named
from queuert_notify.dashboard import create_app
from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
from state_adapters.sqlalchemy import SqlAlchemyStateAdapter


def dashboard_app(
    backend: str = "default",
    *,
    read_only: bool = False,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> ASGIApp:
    """The dashboard (``queuert_notify.dashboard.create_app``) of the ``TASKS`` backend
    ``backend``: its database and table prefix, its Redis for live updates. Call it after
    ``get_asgi_application()`` (Django is set up then). Needs the ``dashboard`` extra."""
    options = backend_named(backend).settings
    url = engine_url(connections[options.database].settings_dict, asynchronous=True)
    state = SqlAlchemyStateAdapter(create_async_engine(url), table_prefix=options.table_prefix)
    if options.redis_url is None:
        return create_app(state, read_only=read_only, token=token, allowed_hosts=allowed_hosts)
    notify = RedisNotifyAdapter(url=options.redis_url, prefix=options.redis_prefix)
    app = create_app(state, notify, read_only=read_only, token=token, allowed_hosts=allowed_hosts)
    return _ConnectingFirst(app, notify)


class _ConnectingFirst:
    """Connects the notify adapter before the first request: an app mounted in another
    gets no lifespan events to do it in. The connection lives as long as the process."""

    def __init__(self, app: ASGIApp, notify: RedisNotifyAdapter) -> None:
        self.app = app
        self.notify = notify
        self._connected = False
        self._lock = asyncio.Lock()

    @property
    def routes(self) -> Any:
        """The dashboard's routes, which Starlette's ``Mount`` reads to build its links."""
        return getattr(self.app, "routes", [])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._connected and scope["type"] in {"http", "websocket"}:
            async with self._lock:
                await self.notify.connect()
                self._connected = True
        await self.app(scope, receive, send)
