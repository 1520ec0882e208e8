"""The example in README.md is a complete program that runs as written, with no server."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"^## Example\n.*?^```python\n(.*?)^```", readme, re.S | re.M)
    assert found is not None, "README.md has no python block under '## Example'"
    return found.group(1)


async def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_readme_example())
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "example.py",
        cwd=tmp_path,  # it writes app.db next to itself
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    assert text.splitlines() == [
        "sending the welcome mail to ada@example.com",
        "completed {'sent': True}",
    ]
