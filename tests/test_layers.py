"""The layers point one way: the state layer never imports the queue above it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import state_adapters


def test_importing_every_state_adapters_module_loads_nothing_of_queuert_notify() -> None:
    modules = [
        info.name
        for info in pkgutil.walk_packages(state_adapters.__path__, "state_adapters.")
        if ".migrations.versions" not in info.name and not info.name.endswith("migrations.env")
    ]
    assert (
        "state_adapters.sqlalchemy" in modules
        and "state_adapters.transactions.after_commit" in modules
    )
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


_WORKER_MODULES = [
    "worker/worker",
    "worker/settings",
    "worker/startup_checks",
    "worker/wake/policy",
    "worker/wake/subscriptions",
    "worker/slots",
    "worker/claimer",
    "worker/completion_batcher",
    "worker/job_run",
    "worker/job_execution",
    "worker/lease_keeper",
    "worker/job_outcome",
    "worker/shutdown",
    "maintenance/reaper",
    "maintenance/schedules",
    "maintenance/pruner",
    "maintenance/services",
]


@pytest.mark.parametrize("module", ["client/client", "client/chain_spec", *_WORKER_MODULES])
def test_the_client_and_the_worker_import_no_sqlalchemy_and_probe_nothing(module: str) -> None:
    """Sessions, retries and after-commit plumbing belong to the state layer, and the
    state adapter's capabilities are declared by its protocol, not probed."""
    import ast
    from pathlib import Path

    source = (Path(__file__).parent.parent / "queuert_notify" / f"{module}.py").read_text()
    tree = ast.parse(source)
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] == "sqlalchemy"], imported
    probes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"
    ]
    assert not probes, f"{module}.py probes with getattr at lines {[p.lineno for p in probes]}"
