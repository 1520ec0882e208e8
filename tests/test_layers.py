"""The layers point one way: the state layer never imports the queue above it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import state_adapters


def test_importing_every_state_adapters_module_loads_nothing_of_queuert_notify() -> None:
    modules = [
        info.name
        for info in pkgutil.walk_packages(state_adapters.__path__, "state_adapters.")
        if ".migrations.versions" not in info.name and not info.name.endswith("migrations.env")
    ]
    assert "state_adapters.sqlalchemy" in modules and "state_adapters.after_commit" in modules
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'queuert_notify'))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", f"state_adapters imported {loaded}"


def test_the_state_layers_errors_are_the_ones_users_catch() -> None:
    import queuert_notify
    import state_adapters.errors as state_errors
    from queuert_notify import errors

    for name in ("ConfigurationError", "InvalidInputError", "JobOwnershipLostError"):
        assert getattr(errors, name) is getattr(state_errors, name)
        assert getattr(queuert_notify, name) is getattr(state_errors, name)
    assert issubclass(errors.NotifyAdapterClosedError, state_errors.QueuertError)


def test_the_client_imports_no_sqlalchemy() -> None:
    """Sessions, retries and after-commit plumbing belong to the state layer."""
    import ast
    from pathlib import Path

    import queuert_notify.client

    tree = ast.parse(Path(queuert_notify.client.__file__).read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] == "sqlalchemy"], imported
