"""The runnable examples do what their pages say: docs/transactional-enqueue.md's, and
README.md's, which runs as written with no server."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


async def _run(script: Path, cwd: Path) -> str:
    """Run ``script`` with this interpreter in ``cwd``; its output, after a clean exit."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


async def test_the_transactional_enqueue_example_runs() -> None:
    text = await _run(REPO / "docs/examples/transactional_enqueue.py", REPO)
    assert "completed, output {'sent_to': 'ada@example.com'}" in text
    assert "users: ['ada@example.com'], ada welcomed: True" in text
    assert "jobs per status: {'completed': 1}" in text


def _readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"^## Example\n.*?^```python\n(.*?)^```", readme, re.S | re.M)
    assert found is not None, "README.md has no python block under '## Example'"
    return found.group(1)


async def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_readme_example())
    text = await _run(tmp_path / "example.py", tmp_path)  # it writes app.db there
    assert text.splitlines() == [
        "sending the welcome mail to ada@example.com",
        "completed {'sent': True}",
    ]
