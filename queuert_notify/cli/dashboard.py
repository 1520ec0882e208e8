"""``queuert-notify dashboard``: the web dashboard served on its own (extra ``dashboard``).

It binds 127.0.0.1 unless told otherwise, and any other address requires ``--token``:
the dashboard shows every job's input and can cancel chains, so it is never reachable
from the network without a secret. It answers only requests for the address it is bound
to (and, on loopback, ``localhost``) plus the ``--allowed-host`` names, so a web page
that rebinds its own name to that address cannot use it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

import click

from queuert_notify.cli.database import check_reachable, create_engine
from queuert_notify.cli.options import (
    REDIS_URL_ENV,
    database_url_option,
    redis_prefix_option,
    table_prefix_option,
)
from queuert_notify.cli.output import run
from queuert_notify.errors import ConfigurationError

logger = logging.getLogger(__name__)

TOKEN_ENV = "QUEUERT_DASHBOARD_TOKEN"


def allowed_hosts(host: str, port: int, extra: Sequence[str]) -> list[str] | None:
    """The ``Host`` values a dashboard bound to ``host``:``port`` answers: that address
    and, on loopback, each loopback name, with the port; plus ``extra``. A wildcard
    bind (``0.0.0.0``, ``::``; a token is required there) answers any unless ``extra``
    names some."""
    names = {"localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else set()
    if _is_wildcard(host):
        if not extra:
            return None
    else:
        names.add(f"[{host.strip('[]')}]" if ":" in host else host)
    with_port = {f"{name}:{port}" for name in names}
    # Browsers leave the default port out of the Host header.
    return [*sorted(with_port | (names if port == 80 else set())), *extra]


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command("dashboard")
@database_url_option
@table_prefix_option
@click.option(
    "--redis-url",
    envvar=REDIS_URL_ENV,
    show_envvar=True,
    default=None,
    help="Redis the workers use: live updates are pushed from it and actions wake "
    "workers at once. Without it pages re-read every 15 s.",
)
@redis_prefix_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    show_envvar=True,
    default=None,
    help="Secret every request must carry; required with a --host other than a loopback address.",
)
@click.option(
    "--allowed-host",
    "extra_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    help="Also answer requests for this host name (repeatable), e.g. the name a reverse "
    "proxy forwards; without a port, on any port. Requests for other names get 400 "
    "[default: the bound address, and localhost on loopback, with --port].",
)
@click.option("--read-only", is_flag=True, help="Show the queue; hide and refuse actions.")
def dashboard(
    database_url: str,
    table_prefix: str,
    redis_url: str | None,
    redis_prefix: str,
    host: str,
    port: int,
    token: str | None,
    extra_hosts: tuple[str, ...],
    read_only: bool,
) -> None:
    """Serve the web dashboard (overview, chains, actions, live updates)."""
    if not is_loopback(host) and not token:
        raise click.UsageError(
            f"--host {host} makes the dashboard reachable from other machines: pass "
            f"--token (or set ${TOKEN_ENV}) so that only people with the secret see it"
        )
    try:
        import uvicorn  # noqa: F401

        from queuert_notify.dashboard import create_app  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the 'dashboard' extra ({exc}): "
            "pip install 'queuert-notify[dashboard]'"
        ) from None
    hosts = allowed_hosts(host, port, extra_hosts)
    run(
        _serve(
            database_url, table_prefix, redis_url, redis_prefix, host, port, token, hosts, read_only
        )
    )


async def _serve(
    database_url: str,
    table_prefix: str,
    redis_url: str | None,
    redis_prefix: str,
    host: str,
    port: int,
    token: str | None,
    hosts: list[str] | None,
    read_only: bool,
) -> None:
    import uvicorn

    from queuert_notify.dashboard import create_app
    from queuert_notify.notify.protocol import NotifyAdapter
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    engine = create_engine(database_url)
    notify: NotifyAdapter | None = None
    try:
        await check_reachable(engine, database_url)
        state = SqlAlchemyStateAdapter(engine, table_prefix=table_prefix)
        if redis_url is not None:
            notify = RedisNotifyAdapter(redis_url, prefix=redis_prefix)
            try:
                await notify.connect()
            except ConfigurationError as exc:
                click.echo(f"warning: {exc}; pages re-read every 15 s instead", err=True)
                await notify.close()
                notify = None
        app = create_app(state, notify, read_only=read_only, token=token, allowed_hosts=hosts)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            # Live pages hold their connections open: do not wait for them to end.
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        shown = f"[{host}]" if ":" in host else host
        click.echo(
            f"dashboard on http://{shown}:{port}/"
            + (" (open it once with ?token=<your token>)" if token else "")
            + (" read-only" if read_only else "")
        )
        await server.serve()
    finally:
        if notify is not None:
            await notify.close()
        await engine.dispose()
