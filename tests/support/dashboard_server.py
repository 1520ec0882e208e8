"""Serving the dashboard in a test: uvicorn on a free loopback port in the test's own
event loop, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.support.services import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_ENV = "QUEUERT_SCREENSHOTS_DIR"
"""Where browser tests also save their screenshots (the docs' are made with
``QUEUERT_SCREENSHOTS_DIR=docs/images``); they always go to the test's tmp_path."""


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 and a free port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.025)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def chromium_path() -> str:
    """Debian's chromium (``./dev test`` installs it); skipped without it, failed
    under ``CI=true``."""
    if Path(CHROMIUM).exists() or shutil.which("chromium"):
        return CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    reason = f"no chromium at {CHROMIUM} (apt-get install chromium; ./dev test does it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing browser is a failure)", pytrace=False)
    pytest.skip(reason)


def screenshot_paths(tmp_path: Path, name: str) -> list[Path]:
    """Where a screenshot called ``name`` goes: the test's tmp_path, and the directory
    of :data:`SCREENSHOTS_ENV` when set."""
    paths = [tmp_path / f"{name}.png"]
    shared = os.environ.get(SCREENSHOTS_ENV)
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        paths.append(Path(shared) / f"{name}.png")
    return paths
