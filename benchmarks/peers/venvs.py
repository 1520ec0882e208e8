"""The peers' virtualenvs of ``python -m benchmarks peers``, made by the benchmark itself.

pgqueuer, procrastinate, chancy and awa share one (``--venv``, default
``.bench-peers/``) made with this interpreter; Oban for Python, which requires
Python 3.12 or later, gets one of its own (``--oban-venv``, default
``.bench-oban/``) made with the first such interpreter found: this one, pyenv's
installed versions, then ``python3.12``/``python3.13`` on the PATH. Each is
created when missing and reinstalled when its requirements file changed, so the
product never depends on any of them.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

_BENCHMARKS = Path(__file__).resolve().parent.parent
REQUIREMENTS = _BENCHMARKS / "peers-requirements.txt"
OBAN_REQUIREMENTS = _BENCHMARKS / "peers-oban-requirements.txt"
OBAN_MINIMUM = (3, 12)


def ensure(venv: Path, requirements: Path, base_python: str) -> str:
    """The interpreter of ``venv``, created with ``base_python`` and ``requirements``
    installed unless a stamp of that file's content says they already are."""
    python = venv / "bin" / "python"
    stamp = venv / f".installed-{hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]}"
    if not stamp.exists():
        if not python.exists():
            _check(base_python, "-m", "venv", str(venv))
        _check(str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements))
        for old in venv.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return str(python)


def python_for_oban() -> tuple[str | None, str]:
    """An interpreter new enough for Oban for Python, and where it was looked for
    (said in the report when none was found)."""
    if sys.version_info >= OBAN_MINIMUM:
        return sys.executable, "this interpreter"
    places = []
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        versions = Path(done.stdout.strip()) / "versions"
        places.append(str(versions))
        candidates = sorted(
            (_version(path.name), path / "bin" / "python")
            for path in versions.glob("3.*")
            if _version(path.name) >= OBAN_MINIMUM
        )
        for _, python in candidates:
            if python.exists():
                return str(python), places[0]
    for name in ("python3.12", "python3.13", "python3.14"):
        places.append(f"{name} on the PATH")
        found = shutil.which(name)
        if found is not None:
            return found, places[-1]
    return None, ", ".join(places)


def _version(name: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", name)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _check(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
