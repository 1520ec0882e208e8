"""The runnable example of docs/transactional-enqueue.md does what the page says."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


async def test_the_transactional_enqueue_example_runs() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "docs/examples/transactional_enqueue.py",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "completed, output {'sent_to': 'ada@example.com'}" in text
    assert "users: ['ada@example.com'], ada welcomed: True" in text
    assert "jobs per status: {'completed': 1}" in text
