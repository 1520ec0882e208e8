"""The ``queuert-notify`` command starts in a fraction of a second because it imports
only what the command runs on: ``--help`` loads no database, notify or web library and
no command's module, ``chains list`` only its own modules, SQLAlchemy and the database's
driver (on SQLite, nothing of Postgres). Counted in ``sys.modules`` of
a fresh interpreter, not timed (the time is measured by ``python -m benchmarks
cli-start``, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

import queuert_notify
import queuert_notify.worker
import state_adapters
from queuert_notify.cli import COMMANDS, main
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


def _after(code: str, which: str) -> set[str]:
    """What the expression ``which`` gives of ``modules`` (the names in ``sys.modules``)
    once ``code`` ran in a fresh interpreter."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        "modules = set(sys.modules)\n"
        f"print(json.dumps(sorted({which})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _loaded_after(code: str) -> set[str]:
    """The top-level packages among :data:`HEAVY` loaded once ``code`` ran."""
    return _after(code, f"{{m.split('.')[0] for m in modules}} & {set(HEAVY)!r}")


def _commands_loaded_after(code: str) -> set[str]:
    """The modules of ``queuert_notify.cli`` (but the package) loaded once ``code`` ran."""
    return _after(
        code, "{m.rpartition('.')[2] for m in modules if m.startswith('queuert_notify.cli.')}"
    )


def test_importing_the_package_or_the_command_loads_no_database_notify_or_web_library() -> None:
    assert _loaded_after("import queuert_notify") == set()
    assert _loaded_after("import state_adapters") == set()
    assert _loaded_after("import queuert_notify.cli") == set()
    assert _loaded_after("from queuert_notify import ConfigurationError") == set()
    assert _loaded_after("import queuert_notify.worker") == set()


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


def test_help_lists_every_command_without_importing_one() -> None:
    listing = "from queuert_notify.cli import main\nmain(['--help'], standalone_mode=False)"
    assert _commands_loaded_after(listing) == set()


def test_a_command_imports_its_own_modules_only(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    command = "from queuert_notify.cli import main\nmain({argv!r}, standalone_mode=False)"
    _commands_loaded_after(command.format(argv=["migrate", "--database-url", url]))
    listing = command.format(argv=["chains", "list", "--database-url", url])
    # chains (with its logs), and what it prints with: not worker, dashboard, health, ...
    used = {"chains", "chain_logs", "database", "options", "output", "types", "workers"}
    assert _commands_loaded_after(listing) == used
    # Nor the health report's classes, which the state adapter imports when it reports.
    report = "modules & {'state_adapters.health'}"
    assert _after(listing, report) == set()
    assert _after(listing.replace("'chains', 'list'", "'health'"), report) != set()


def test_json_output_loads_no_rich(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    command = "from queuert_notify.cli import main\nmain({argv!r}, standalone_mode=False)"
    _after(command.format(argv=["migrate", "--database-url", url]), "modules")
    rich = "{m for m in modules if m.split('.')[0] == 'rich'}"
    for name in (["chains", "list"], ["workers"]):
        argv = [*name, "--database-url", url]
        assert _after(command.format(argv=[*argv, "--json"]), rich) == set(), name
        printed = _after(command.format(argv=argv), rich)
        assert "rich.table" in printed, name
        # Nor rich's table of emoji codes: a stored ":name:" prints as stored.
        assert "rich._emoji_codes" not in printed, name


def test_the_listing_shows_each_commands_own_help() -> None:
    context = click.Context(main)
    assert main.list_commands(context) == sorted(COMMANDS)
    for name, (_, _, listed) in COMMANDS.items():
        command = main.get_command(context, name)
        assert command is not None and command.name == name
        assert not command.hidden and not command.deprecated and not command.short_help
        # The first sentence of the command's own help, as click cuts it for a listing.
        stand_in = click.Command(name, help=listed)
        assert stand_in.get_short_help_str(10_000) == command.get_short_help_str(10_000), name
    assert main.get_command(context, "wroker") is None
    with pytest.raises(click.UsageError) as mistyped:
        main(["wroker"], standalone_mode=False)
    assert "Did you mean one of: 'worker', 'workers'?" in mistyped.value.format_message()


def _called_then_as_program(preamble: str, argv: list[str], report: str) -> str:
    """What ``report`` (an expression) gives in a fresh interpreter that ran
    ``preamble``, then the CLI called with ``argv`` (as a test or an application calls
    it), then the CLI run as the program on the same arguments (``sys.argv``)."""
    probe = (
        "import gc, sys\n"
        f"{preamble}\n"
        "from queuert_notify.cli import main\n"
        f"main({argv!r}, standalone_mode=False)\n"
        "called = gc.get_freeze_count()\n"
        f"sys.argv = ['queuert-notify', *{argv!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        f"    print({report})\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_only_the_program_skips_collecting_at_exit() -> None:
    # Run as the program (sys.argv), the command freezes the collector's objects as it
    # ends; called with arguments (a test, an application), it leaves them alone.
    report = "called, gc.get_freeze_count() > 0"
    assert _called_then_as_program("", ["--help"], report) == "0 True"


def test_the_program_loads_a_commands_libraries_uncollected_and_collects_after(
    tmp_path: Path,
) -> None:
    # Run as the program, the collector is off while the command loads SQLAlchemy and the
    # driver, and what they made is frozen after; by the time the command reads, the
    # collector runs again (a `chains logs --follow` runs for hours). Called with
    # arguments, the collector is left alone.
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    command = "from queuert_notify.cli import main\nmain({argv!r}, standalone_mode=False)"
    _after(command.format(argv=["migrate", "--database-url", url]), "modules")
    preamble = (
        "import state_adapters.sqlalchemy as adapter\n"
        "seen = []\n"
        "reads = adapter.SqlAlchemyStateAdapter.list_chains\n"
        "async def list_chains(self, **options):\n"
        "    seen.append((gc.isenabled(), gc.get_freeze_count() > 0))\n"
        "    return await reads(self, **options)\n"
        "adapter.SqlAlchemyStateAdapter.list_chains = list_chains"
    )
    argv = ["chains", "list", "--database-url", url, "--json"]
    assert _called_then_as_program(preamble, argv, "seen") == "[(True, False), (True, True)]"


def test_chains_list_on_sqlite_loads_nothing_of_postgres(tmp_path: Path) -> None:
    # SQLAlchemy's Postgres dialect package, the drivers and the adapter's Postgres
    # modules are loaded by a Postgres engine only.
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    command = "from queuert_notify.cli import main\nmain({argv!r}, standalone_mode=False)"
    _loaded_after(command.format(argv=["migrate", "--database-url", url]))
    listing = command.format(argv=["chains", "list", "--database-url", url])
    postgres = (
        "sqlalchemy.dialects.postgresql",
        "state_adapters.postgres",
        "state_adapters.drivers",
        "asyncpg",
        "psycopg",
    )
    assert _after(listing, f"{{m for m in modules if m.startswith({postgres!r})}}") == set()


def test_every_public_name_is_listed_and_found_on_first_use() -> None:
    for package in (queuert_notify, state_adapters, queuert_notify.worker):
        assert set(package.__all__) <= set(dir(package))
        for name in package.__all__:
            assert getattr(package, name) is not None, name
    assert queuert_notify.WorkerRecord is WorkerRecord
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        queuert_notify.Clinet  # noqa: B018
    with pytest.raises(AttributeError, match=r"'queuert_notify\.worker' has no attribute 'Wroker'"):
        queuert_notify.worker.Wroker  # noqa: B018
