"""The ``queuert-notify`` command starts in a fraction of a second because it imports
only what the command runs on: ``--help`` loads no database, notify or web library, and
``chains list`` only SQLAlchemy and the database's driver. Counted in ``sys.modules`` of
a fresh interpreter, not timed (the time is measured by ``python -m benchmarks
cli-start``, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import queuert_notify
import state_adapters
from state_adapters.model import WorkerRecord

HEAVY = (
    "sqlalchemy",
    "alembic",
    "redis",
    "nats",
    "psycopg",
    "psycopg2",
    "asyncpg",
    "aiosqlite",
    "starlette",
    "jinja2",
    "uvicorn",
    "opentelemetry",
    "croniter",
)
"""Libraries a command that does not use them must not load."""


def _loaded_after(code: str) -> set[str]:
    """The top-level packages among :data:`HEAVY` loaded once ``code`` ran in a fresh
    interpreter."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_importing_the_package_or_the_command_loads_no_database_notify_or_web_library() -> None:
    assert _loaded_after("import queuert_notify") == set()
    assert _loaded_after("import state_adapters") == set()
    assert _loaded_after("import queuert_notify.cli") == set()
    assert _loaded_after("from queuert_notify import ConfigurationError") == set()


def test_help_of_every_command_loads_none_of_them() -> None:
    show_help = (
        "from queuert_notify.cli import main\n"
        "for argv in (['--help'], ['chains', 'list', '--help'], ['worker', '--help'],\n"
        "             ['dashboard', '--help'], ['workers', '--help']):\n"
        "    main(argv, standalone_mode=False)\n"
    )
    assert _loaded_after(show_help) == set()


def test_chains_list_loads_sqlalchemy_and_the_databases_driver_only(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    command = "from queuert_notify.cli import main\nmain({argv!r}, standalone_mode=False)"
    migrated = _loaded_after(command.format(argv=["migrate", "--database-url", url]))
    assert "alembic" in migrated
    listing = command.format(argv=["chains", "list", "--database-url", url])
    assert _loaded_after(listing) == {"sqlalchemy", "aiosqlite"}


def test_every_public_name_is_listed_and_found_on_first_use() -> None:
    for package in (queuert_notify, state_adapters):
        assert set(package.__all__) <= set(dir(package))
        for name in package.__all__:
            assert getattr(package, name) is not None, name
    assert queuert_notify.WorkerRecord is WorkerRecord
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        queuert_notify.Clinet  # noqa: B018
