"""The dashboard's ASGI application: routes, rendering and actions.

Pages are rendered on the server with Jinja2 (autoescaping every value: job input,
output, errors and names are data, never markup) and kept live by ``live.py``'s
server-sent events; ``static/live.js`` is the only script. Actions (cancel, retry, run
now) are POSTs checked by :class:`~queuert_notify.dashboard.security.Csrf` and go through
:class:`~queuert_notify.client.client.Client`, so their notifications reach the workers. With
``read_only`` they are neither shown nor accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from queuert_notify.client.client import Client
from queuert_notify.dashboard.live import live_events
from queuert_notify.dashboard.pages import Pages, View, Watch
from queuert_notify.dashboard.security import CSRF_FIELD, AllowedHosts, Csrf, HostGate, TokenGate
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter
from state_adapters.errors import ChainNotFoundError, InvalidInputError
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)

_HERE = Path(str(files("queuert_notify.dashboard")))
ACTIONS = {"cancel": "cancelled", "retry": "retried", "trigger": "made due now"}
"""Chain actions by URL name, and what the notice after each says was done."""
TYPE_ACTIONS = {"pause": "paused", "resume": "resumed"}
"""Job-type actions by URL name, and what the notice after each says was done."""
TYPE_FIELD = "type_name"
"""The form field naming the job type a type action acts on."""

SECURITY_HEADERS = {
    # The page's own script and stylesheet only: even a value that escaped escaping
    # could not run a script or load anything from elsewhere.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def create_app(
    state: StateAdapter,
    notify: NotifyAdapter | None = None,
    *,
    read_only: bool = False,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> ASGIApp:
    """The dashboard as an ASGI app, to mount in your own (``Mount("/queue", app)``) or
    serve with ``queuert-notify dashboard``.

    ``state``: the queue's state adapter (every read and action goes through it).
    ``notify``: a notify adapter you have connected and will close yourself; it pushes
    live updates and announces actions to workers. Without it, pages re-read every
    15 seconds and workers find retried or triggered jobs at their next poll.
    ``read_only``: hide and refuse every action. ``token``: require this secret on
    every request (``Authorization: Bearer``, or open any page once with
    ``?token=...``, which sets a cookie). ``allowed_hosts``: the names the dashboard is
    reached by (``name:port``, or ``name`` for any port); a request for another
    ``Host`` gets 400 and an action from another origin 403 — what defeats DNS
    rebinding of a dashboard without a token. ``None``: every ``Host`` is served (your
    application checks it), and actions must come from the request's own host.
    """
    hosts = None if allowed_hosts is None else AllowedHosts(allowed_hosts)
    csrf = Csrf.for_token(token, hosts)
    dashboard = Dashboard(state, notify, read_only=read_only, csrf=csrf)
    middleware = [] if hosts is None else [Middleware(HostGate, hosts=hosts)]
    if token is not None:
        middleware.append(Middleware(TokenGate, token=token))
    return Starlette(routes=dashboard.routes(), middleware=middleware)


class Dashboard:
    """The handlers of :func:`create_app`."""

    def __init__(
        self, state: StateAdapter, notify: NotifyAdapter | None, *, read_only: bool, csrf: Csrf
    ) -> None:
        self.pages = Pages(state)
        self.notify = notify
        # Actions are written through a Client so their notifications are published
        # after the commit, as any application's would be.
        self.client = Client(state=state, notify=notify or NoopNotifyAdapter())
        self.read_only = read_only
        self.csrf = csrf
        self.templates = Environment(
            loader=FileSystemLoader(_HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["ago"] = _ago

    def routes(self) -> list[Route | Mount]:
        return [
            Route("/", self.overview, name="overview"),
            Route("/chains", self.chains, name="chains"),
            Route("/health", self.health, name="health"),
            Route("/chains/{chain_id}", self.chain, name="chain"),
            Route("/chains/{chain_id}/{action}", self.act, methods=["POST"], name="act"),
            # The type name travels in the form, not the path: any name the queue
            # accepts ("send/email", "q?x#y", "..") stays one value there.
            Route("/types/{action}", self.act_on_type, methods=["POST"], name="type_act"),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ]

    # -- pages -------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        return await self._page(request, self.pages.overview)

    async def chains(self, request: Request) -> Response:
        params = dict(request.query_params)
        return await self._page(request, lambda: self.pages.chains(params))

    async def health(self, request: Request) -> Response:
        params = dict(request.query_params)
        return await self._page(request, lambda: self.pages.health(params))

    async def chain(self, request: Request) -> Response:
        chain_id = request.path_params["chain_id"]
        return await self._page(request, lambda: self.pages.chain(chain_id))

    async def _page(self, request: Request, read: Callable[[], Awaitable[View]]) -> Response:
        """The page ``read()`` builds; with ``?live=1`` its event stream instead."""
        nonce, new_nonce = self.csrf.nonce(request)
        base = {
            "request": request,
            "read_only": self.read_only,
            "csrf_field": CSRF_FIELD,
            "csrf": self.csrf.token(nonce),
            "type_field": TYPE_FIELD,
            "live_mode": "notify" if self.notify is not None else "refresh",
            "url": lambda name, **params: _url(request, name, **params),
            "notice": _notice(request.query_params),
        }
        if request.query_params.get("live") == "1":

            async def render() -> tuple[str, Watch]:
                view = await self._read(read)
                template = self.templates.get_template(view.template)
                context = template.new_context({**base, **view.context})
                return "".join(template.blocks["live"](context)), view.watch

            return StreamingResponse(
                live_events(render, self.notify),
                media_type="text/event-stream",
                headers={**SECURITY_HEADERS, "x-accel-buffering": "no"},
            )
        view = await self._read(read)
        query = [(k, v) for k, v in parse_qsl(request.url.query) if k not in ("live", "done")]
        live_url = request.url.path + "?" + urlencode([*query, ("live", "1")])
        html = self.templates.get_template(view.template).render(
            **base, **view.context, live_url=live_url if view.status_code == 200 else None
        )
        response = HTMLResponse(html, status_code=view.status_code, headers=SECURITY_HEADERS)
        if new_nonce:
            self.csrf.remember(request, response, nonce)
        return response

    async def _read(self, read: Callable[[], Awaitable[View]]) -> View:
        try:
            view = await read()
        except InvalidInputError as exc:
            return View("error.html", {"message": str(exc)}, status_code=400)
        return view

    # -- actions -----------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        """Cancel, retry or trigger a chain, then back to its page with a notice."""
        chain_id = request.path_params["chain_id"]
        action = request.path_params["action"]
        refused = await self._refused(request, action, ACTIONS)
        if refused is not None:
            return refused
        try:
            if action == "cancel":
                await self.client.cancel_chain(chain_id)
            elif action == "retry":
                await self.client.retry_chain(chain_id)
            else:
                await self.client.trigger_chain(chain_id)
        except ChainNotFoundError as exc:
            return self._refuse(request, 404, str(exc))
        except InvalidInputError as exc:
            return self._refuse(request, 409, str(exc))
        logger.info("dashboard action", extra={"chain_id": chain_id, "action": action})
        target = _url(request, "chain", chain_id=chain_id) + f"?done={action}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    async def act_on_type(self, request: Request) -> Response:
        """Pause or resume a job type, then back to the overview with a notice."""
        action = request.path_params["action"]
        refused = await self._refused(request, action, TYPE_ACTIONS)
        if refused is not None:
            return refused
        type_name = (await self._form(request)).get(TYPE_FIELD, "")
        try:
            if action == "pause":
                await self.client.pause_type(type_name)
            else:
                await self.client.resume_type(type_name)
        except InvalidInputError as exc:
            return self._refuse(request, 400, str(exc))
        logger.info("dashboard action", extra={"type_name": type_name, "action": action})
        target = _url(request, "overview") + f"?done={action}&type={quote(type_name)}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    async def _refused(
        self, request: Request, action: str, actions: Mapping[str, str]
    ) -> Response | None:
        """Why an action may not run (read-only, unknown, a missing or stale CSRF
        token), as the page that says so; ``None`` when it may."""
        if self.read_only:
            return self._refuse(request, 403, "this dashboard is read-only")
        if action not in actions:
            return self._refuse(request, 404, f"no action {action!r}")
        if not self.csrf.check(request, await self._form(request)):
            return self._refuse(
                request, 403, "the form's CSRF token is missing or stale: reload the page"
            )
        return None

    @staticmethod
    async def _form(request: Request) -> dict[str, str]:
        """The fields of a POSTed form (values kept exactly, blanks too)."""
        body = (await request.body()).decode("utf-8", "replace")
        return dict(parse_qsl(body, keep_blank_values=True))

    def _refuse(self, request: Request, status: int, message: str) -> Response:
        html = self.templates.get_template("error.html").render(
            request=request,
            message=message,
            url=lambda name, **params: _url(request, name, **params),
            read_only=self.read_only,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _notice(params: Mapping[str, str]) -> str | None:
    """What the notice after an action says was done (``?done=``)."""
    done = params.get("done", "")
    if done in ACTIONS:
        return f"Chain {ACTIONS[done]}."
    if done in TYPE_ACTIONS:
        return f"Type {params.get('type', '')} {TYPE_ACTIONS[done]}."
    return None


def _url(request: Request, name: str, **params: Any) -> str:
    """The path of route ``name`` under wherever the dashboard is mounted."""
    if name == "static":
        return str(request.url_for("static", path=params["path"]).path)
    return str(request.url_for(name, **params).path)


def _when(moment: datetime | None) -> str:
    """UTC, to the second (every stored time is UTC)."""
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ago(moment: datetime | None) -> str:
    """How long ago (or, for a future moment, in how long), roughly."""
    if moment is None:
        return ""
    seconds = (datetime.now(UTC) - moment).total_seconds()
    future, seconds = seconds < 0, abs(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= size:
            amount = f"{int(seconds // size)} {unit}"
            return f"in {amount}" if future else f"{amount} ago"
    return "now"
