"""The architecture, checked on the source: who may import whom, and no import cycles.

The dependency direction is ``kv`` <- ``actors`` <- ``control_plane`` <- ``web``. Inside
``actors`` the control plane sees only the boundary (``actors.api``) and the runtime that
hosts engines in Dask (``actors.runtime``), never the built-in engine's insides. Inside
``control_plane`` each package imports only what sits below it; the CLI is the
composition root, the one module allowed to import ``web``.

The sources are parsed in a separate interpreter: CPython 3.11 keeps the AST
converter's recursion depth in one process-wide counter, so an ``ast.parse`` here can
fail with "AST constructor recursion depth mismatch" while a thread left by an earlier
test (a Dask worker formatting a traceback, which parses source for its carets) parses
at the same moment (CPython gh-106905).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("starlette", "sqlalchemy", "sse_starlette", "alembic", "jinja2")
CP = "dynask.control_plane"

# package folder -> import prefixes its modules must not use
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "kv": ("dynask.actors", CP, "dynask.web", "dask", "distributed", *FRAMEWORKS),
    "actors": (CP, "dynask.web", *FRAMEWORKS),
    "actors/api": ("dynask.actors.engine", "dynask.actors.runtime", "dynask.actors.backends"),
    "actors/engine": ("dynask.actors.runtime", "dynask.actors.backends", "dask", "distributed"),
    "actors/models": (
        *("dynask.actors.api", "dynask.actors.engine", "dynask.actors.runtime"),
        *("dynask.actors.backends", "dask", "distributed"),
    ),
    "control_plane": ("dynask.web", "dynask.actors.engine", "dynask.actors.backends"),
    "control_plane/api": (f"{CP}.cluster", f"{CP}.cli", f"{CP}.planner", f"{CP}.graphs"),
    "control_plane/state": tuple(
        f"{CP}.{p}"
        for p in ("api", "serving", "routing", "disagg", "reliability", "cluster", "planner")
    ),
    "control_plane/routing": (f"{CP}.api", f"{CP}.cluster", f"{CP}.cli", f"{CP}.state"),
    "control_plane/serving": (f"{CP}.api", f"{CP}.cluster", f"{CP}.cli", f"{CP}.planner"),
    "control_plane/reliability": (f"{CP}.api", f"{CP}.cluster", f"{CP}.cli"),
    "control_plane/disagg": (f"{CP}.api", f"{CP}.cluster", f"{CP}.cli"),
    "control_plane/cluster": (f"{CP}.api", f"{CP}.cli"),
    "control_plane/planner": (f"{CP}.api", f"{CP}.cli"),
    "control_plane/observability": tuple(
        f"{CP}.{p}"
        for p in ("api", "serving", "routing", "disagg", "reliability", "cluster", "cli", "state")
    ),
}
# (module file, import prefix): allowed on purpose
ALLOWED = {
    ("control_plane/cli/main.py", "dynask.web"),  # the composition root
}
KNOWN_CYCLES: list[list[str]] = []

_LIST_IMPORTS = """
import ast, json, sys
found = {}
for path in sys.argv[1:]:
    tree = ast.parse(open(path).read(), path)
    every, top = set(), set()
    def visit(node, at_top):
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module] + [child.module + "." + a.name for a in child.names]
            every.update(names[:1] if isinstance(child, ast.ImportFrom) else names)
            if at_top:
                top.update(names)
            inner = at_top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            visit(child, inner)
    visit(tree, True)
    found[path] = {"every": sorted(every), "top": sorted(top)}
print(json.dumps(found))
"""


@cache
def _imports() -> dict[str, dict[str, list[str]]]:
    paths = [str(p) for base in ("kv", "actors", "control_plane", "web") for p in _sources(base)]
    out = subprocess.run(
        [sys.executable, "-c", _LIST_IMPORTS, *paths], capture_output=True, text=True, check=True
    ).stdout
    return {str(Path(path).relative_to(ROOT)): names for path, names in json.loads(out).items()}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _module_of(path: str) -> str:
    return "dynask." + path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_the_dependency_direction(package: str) -> None:
    offences = [
        f"{path} imports {name}"
        for path, names in _imports().items()
        if path.startswith(package + "/")
        for name in names["every"]
        for bad in FORBIDDEN[package]
        if (name == bad or name.startswith(bad + ".")) and (path, bad) not in ALLOWED
    ]
    assert offences == []


def test_no_import_cycles_among_module_level_imports() -> None:
    """Module-level imports (``TYPE_CHECKING`` blocks included) form no cycle."""
    modules = {_module_of(path): names["top"] for path, names in _imports().items()}
    graph = {
        module: {name for name in names if name in modules and name != module}
        for module, names in modules.items()
    }
    assert _cycles(graph) == KNOWN_CYCLES


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_package_holds_more_than_seventeen_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): count
        for base in ("kv", "actors", "control_plane", "web")
        for folder in [ROOT / base, *(ROOT / base).rglob("*/")]
        if folder.is_dir() and folder.name != "__pycache__"
        if (count := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > 17
    }
    assert crowded == {}


def test_every_package_says_what_it_owns() -> None:
    silent = [
        str(init.relative_to(ROOT))
        for base in ("kv", "actors", "control_plane", "web")
        for init in (ROOT / base).rglob("__init__.py")
        if len(init.read_text().strip()) < 40
    ]
    assert silent == []


def test_the_packages_exist() -> None:
    assert all(_sources(package) for package in FORBIDDEN)
