"""Who may see the dashboard and act through it: the access token and CSRF tokens.

- With a token, every request must carry it: ``Authorization: Bearer <token>``, or the
  cookie a browser gets by opening any page once with ``?token=<token>`` (the response
  sets it and redirects to the same page without the token in the address).
- Actions are POSTs whose form carries ``csrf``: an HMAC of a random nonce held in a
  ``SameSite=Strict``, ``HttpOnly`` cookie, so another site can neither read the value
  nor make the browser send the cookie with its own form.
- With allowed hosts, a request whose ``Host`` is not one of them is refused (400): a
  page that rebinds its own name to the dashboard's address (DNS rebinding) sends its
  own name as ``Host``, so it can neither read a page nor post a form. An action's
  ``Origin`` must be one of them too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_COOKIE = "queuert_dashboard_token"
CSRF_COOKIE = "queuert_dashboard_csrf"
CSRF_FIELD = "csrf"

_DENIED = """<!doctype html><html><head><meta charset="utf-8"><title>Token needed</title>
</head><body><h1>This dashboard needs its access token</h1>
<p>Open it once with <code>?token=&lt;token&gt;</code> added to the address, or send
<code>Authorization: Bearer &lt;token&gt;</code>.</p></body></html>"""


def cookie_path(scope: Scope) -> str:
    """The path the dashboard's cookies are scoped to: where it is mounted."""
    return str(scope.get("root_path") or "") + "/"


class TokenGate:
    """ASGI middleware: refuses (401) every request without ``token`` (see the module
    docstring for the ways to present it). Compares in constant time."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        if given is not None and request.method == "GET" and self._valid(given):
            await self._remember(request)(scope, receive, send)
            return
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        if self._valid(bearer) or self._valid(request.cookies.get(TOKEN_COOKIE)):
            await self.app(scope, receive, send)
            return
        await HTMLResponse(_DENIED, status_code=401)(scope, receive, send)

    def _valid(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token)

    def _remember(self, request: Request) -> Response:
        """Set the token cookie and redirect to the page without ``token=`` in its URL
        (so it stays out of the history, the logs and the Referer header)."""
        query = urlencode([(k, v) for k, v in parse_qsl(request.url.query) if k != "token"])
        # One leading slash: "//host/..." would send the browser to another site.
        target = "/" + request.url.path.lstrip("/") + (f"?{query}" if query else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            TOKEN_COOKIE,
            self.token.decode(),
            path=cookie_path(request.scope),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response


_WRONG_HOST = """<!doctype html><html><head><meta charset="utf-8"><title>Wrong host</title>
</head><body><h1>This dashboard does not answer for this host name</h1>
<p>Open it by one of the names it was given as allowed hosts.</p></body></html>"""


class AllowedHosts:
    """The names a dashboard answers for: ``name:port`` allows that name on that port,
    ``name`` on any port; names compare without regard to case."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.any_port: set[str] = set()
        for host in hosts:
            host = host.strip().lower()
            if not host:
                raise ValueError("an allowed host must not be empty")
            _, port = split_host(host)
            (self.any_port if port is None else self.exact).add(host)

    def allow(self, netloc: str) -> bool:
        """Whether ``netloc`` (a ``Host`` header, an ``Origin``'s host) is allowed."""
        netloc = netloc.strip().lower()
        name, _ = split_host(netloc)
        return bool(netloc) and (netloc in self.exact or name in self.any_port)


def split_host(netloc: str) -> tuple[str, str | None]:
    """``host[:port]`` (``[v6]:port`` too) as (host, port or None)."""
    if netloc.startswith("["):
        name, _, rest = netloc.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else None
    if netloc.count(":") == 1:
        name, _, port = netloc.partition(":")
        return name, port
    return netloc, None


class HostGate:
    """ASGI middleware: refuses (400) every request whose ``Host`` ``hosts`` does not
    allow, before anything is read or done."""

    def __init__(self, app: ASGIApp, hosts: AllowedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.hosts.allow(Request(scope).headers.get("host", "")):
            await HTMLResponse(_WRONG_HOST, status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class Csrf:
    """CSRF tokens bound to a per-browser nonce cookie by an HMAC with ``secret``."""

    def __init__(self, secret: bytes, hosts: AllowedHosts | None = None) -> None:
        self.secret = secret
        self.hosts = hosts

    @classmethod
    def for_token(cls, token: str | None, hosts: AllowedHosts | None = None) -> Csrf:
        """With an access token, the secret derives from it, so every process serving
        the same dashboard accepts the same forms; without one it is random per process.
        ``hosts``: the origins an action may come from (else: the request's own host)."""
        if token is None:
            return cls(secrets.token_bytes(32), hosts)
        return cls(hashlib.sha256(b"queuert-dashboard-csrf:" + token.encode()).digest(), hosts)

    def nonce(self, request: Request) -> tuple[str, bool]:
        """The browser's nonce, and whether it is new (then :meth:`remember` it)."""
        existing = request.cookies.get(CSRF_COOKIE)
        if existing and len(existing) == 43:
            return existing, False
        return secrets.token_urlsafe(32), True

    def token(self, nonce: str) -> str:
        """What a form of the browser holding ``nonce`` must send as ``csrf``."""
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def remember(self, request: Request, response: Response, nonce: str) -> None:
        """Give the browser its nonce cookie."""
        response.set_cookie(
            CSRF_COOKIE,
            nonce,
            path=cookie_path(request.scope),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def check(self, request: Request, form: dict[str, str]) -> bool:
        """Whether a POST carries a valid ``csrf`` for its nonce cookie and, when the
        browser says where it comes from, comes from this dashboard's own origin: one of
        the allowed hosts when there are some (the request's ``Host`` is the caller's to
        choose), else the request's own host."""
        origin = request.headers.get("origin")
        if origin is not None and not self._own_origin(request, origin):
            return False
        nonce = request.cookies.get(CSRF_COOKIE)
        sent = form.get(CSRF_FIELD)
        if not nonce or not sent:
            return False
        return hmac.compare_digest(sent, self.token(nonce))

    def _own_origin(self, request: Request, origin: str) -> bool:
        # Hosts only: behind a TLS-terminating proxy the scheme seen here is http.
        netloc = urlsplit(origin).netloc
        if self.hosts is not None:
            return self.hosts.allow(netloc)
        return netloc == request.headers.get("host")
