"""A web dashboard for the queue (extra ``dashboard``): ``create_app(state, notify)``
returns an ASGI app to mount in your own, ``queuert-notify dashboard`` serves it. May
import the package root, `client`, `notify` and ``state_adapters``."""

from queuert_notify.dashboard.app import create_app

__all__ = ["create_app"]
