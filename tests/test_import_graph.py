"""The tree shows the architecture and the modules import one way: no runtime import
cycle between the modules of ``queuert_notify`` and ``state_adapters``, no folder of more
than 15 modules, no module of more than 500 lines.

The graph is read from the source with ``ast``: an import under ``if TYPE_CHECKING:`` is
left out (it never runs), an import inside a function counts (it runs when the function
does). An edge goes to the module imported, or to the module ``from package import name``
names when ``name`` is a module; the parent packages Python initializes first are not
edges of their own (every module would otherwise depend on its package's re-exports).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("queuert_notify", "state_adapters")
MAX_MODULES_PER_FOLDER = 15
MAX_LINES_PER_MODULE = 500
# Folders whose modules are a list of cases or of migrations, not parts of a design.
_LISTS = (
    "state_adapters/migrations/versions/",
    "queuert_notify/testing/notify_cases/",
    "queuert_notify/testing/state_cases/",
)


def _source_files() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations/versions" not in path.as_posix()
    )


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            yield from _runtime_imports(node)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of both packages it imports at runtime."""
    paths = {_module_name(path): path for path in _source_files()}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in paths else source
                    for alias in node.names
                ]
            graph[name] |= {target for target in targets if target in paths and target != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each as one cycle
    through them (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(_cycle_through(graph, set(component)))
    return components


def _cycle_through(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """One cycle inside a strongly connected component, from its first module back to it."""
    first = min(members)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == first:
                    return [*paths[node], first]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(members)}")


def test_the_packages_have_no_runtime_import_cycle() -> None:
    graph = import_graph()
    assert "state_adapters.sqlalchemy" in graph and "queuert_notify.worker.worker" in graph
    assert "queuert_notify.worker.claimer" in graph["queuert_notify.worker.worker"]
    cycles = find_cycles(graph)
    assert not cycles, "runtime import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_names_a_cycle_and_ignores_type_only_imports(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import x.typed\nelse:\n    import x.otherwise\n"
        "def f():\n    import x.local\n"
    )
    names = [
        alias.name
        for node in _runtime_imports(ast.parse(source))
        for alias in node.names
        if isinstance(node, ast.Import)
    ]
    assert names == ["x.otherwise", "x.local"]


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(ROOT / package).rglob("*")]:
            if not folder.is_dir() or folder.name == "__pycache__":
                continue
            relative = folder.relative_to(ROOT).as_posix() + "/"
            if any(relative.startswith(listed) for listed in _LISTS):
                continue
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_MODULES_PER_FOLDER:
                crowded[relative] = len(modules)
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def test_no_module_is_longer_than_500_lines() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): lines
        for path in _source_files()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES_PER_MODULE
    }
    assert not long, f"modules over {MAX_LINES_PER_MODULE} lines: {long}"
