"""Every documented name imports from its documented path: the public re-exports, the
testing kit, the dashboard, OpenTelemetry, the state adapter's module, the paths the CLI
runs, and every import and module path the docs name (files they name exist)."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

import queuert_notify
import state_adapters

ROOT = Path(__file__).parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "docs").rglob("*.py")])
_PACKAGES = ("queuert_notify", "state_adapters")
_IMPORT = re.compile(r"^\s*from ((?:queuert_notify|state_adapters)[\w.]*) import ([\w, ]+)", re.M)
_DOTTED = re.compile(r"`~?((?:queuert_notify|state_adapters)(?:\.\w+)+)")
_FILE = re.compile(r"\b((?:queuert_notify|state_adapters)/[\w/]+\.(?:py|lua))\b")


def _resolve(dotted: str) -> Any:
    """The module ``dotted`` names, or the attribute of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def _is_module_path(dotted: str) -> bool:
    """Whether ``dotted`` starts with a module or package of ours (``queuert_notify.jobs``),
    not an OpenTelemetry attribute or metric name (``queuert_notify.job.type``)."""
    package, first = dotted.split(".")[:2]
    return (ROOT / package / f"{first}.py").exists() or (ROOT / package / first).is_dir()


def _doc_imports() -> list[tuple[str, str]]:
    found = set()
    for doc in DOCS:
        for module, names in _IMPORT.findall(doc.read_text()):
            found |= {(module, name.strip()) for name in names.split(",") if name.strip()}
    return sorted(found)


def _doc_dotted_paths() -> list[str]:
    found = set()
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            if line.lstrip().startswith("|"):
                continue  # tables of span attributes and metric names
            found |= {name for name in _DOTTED.findall(line) if _is_module_path(name)}
    return sorted(found)


@pytest.mark.parametrize(
    ("package", "names"),
    [
        (queuert_notify, queuert_notify.__all__),
        (state_adapters, state_adapters.__all__),
        (importlib.import_module("queuert_notify.testing"), ["run_until_idle"]),
    ],
    ids=["queuert_notify", "state_adapters", "queuert_notify.testing"],
)
def test_every_public_name_imports_from_its_package(package: Any, names: list[str]) -> None:
    for name in names:
        assert getattr(package, name) is not None, name


def test_the_testing_kits_import_from_queuert_notify_testing() -> None:
    from queuert_notify.testing import (  # noqa: F401
        NotifyAdapterConformance,
        Recorder,
        StateAdapterConformance,
        run_until_idle,
    )


def test_the_documented_module_paths_import() -> None:
    from queuert_notify import ChainSpec, Client, RedisNotifyAdapter, Worker
    from queuert_notify.client import ChainSpec as ChainSpecOfClient
    from queuert_notify.client import Client as ClientOfClient
    from queuert_notify.dashboard import create_app
    from queuert_notify.notify.redis import RedisNotifyAdapter as RedisOfNotify
    from queuert_notify.otel import instrument
    from queuert_notify.worker import Worker as WorkerOfWorker
    from state_adapters.notifications import wait_for_notifications
    from state_adapters.sqlalchemy import SqlAlchemyStateAdapter

    assert (ClientOfClient, ChainSpecOfClient, WorkerOfWorker, RedisOfNotify) == (
        Client,
        ChainSpec,
        Worker,
        RedisNotifyAdapter,
    )
    assert SqlAlchemyStateAdapter is state_adapters.SqlAlchemyStateAdapter
    assert callable(create_app) and callable(instrument) and callable(wait_for_notifications)


def test_the_cli_entry_points_import() -> None:
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attribute = script["queuert-notify"].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    # `queuert-notify worker --processes=N` runs `python -m queuert_notify.cli`.
    assert importlib.util.find_spec("queuert_notify.cli.__main__") is not None
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert wheel["targets"]["wheel"]["packages"] == list(_PACKAGES)


def test_every_import_in_the_docs_works() -> None:
    imports = _doc_imports()
    assert ("queuert_notify.testing", "run_until_idle") in imports
    failed = []
    for module, name in imports:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            failed.append(f"from {module} import {name}: {exc}")
    assert not failed, failed


def test_every_module_path_the_docs_name_resolves() -> None:
    paths = _doc_dotted_paths()
    assert "queuert_notify.otel" in paths
    failed = []
    for dotted in paths:
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as exc:
            failed.append(f"{dotted}: {exc!r}")
    assert not failed, failed


def test_every_source_file_the_docs_name_exists() -> None:
    named = {name for doc in DOCS for name in _FILE.findall(doc.read_text())}
    assert named
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, missing
