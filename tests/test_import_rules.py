"""The dependency direction kv <- actors <- control_plane <- web, checked on the source.

``kv`` imports nothing of the project and no framework; ``actors`` never imports
Starlette, SQLAlchemy, the control plane or the web UI; ``web`` is imported only by the
CLI (the composition root).

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

FORBIDDEN = {
    "kv": (
        "dynask.actors",
        "dynask.control_plane",
        "dynask.web",
        "dask",
        "distributed",
        *FRAMEWORKS,
    ),
    "actors": ("dynask.control_plane", "dynask.web", *FRAMEWORKS),
    "control_plane": ("dynask.web",),
}
COMPOSITION_ROOT = ROOT / "control_plane" / "cli.py"


_LIST_IMPORTS = """
import ast, json, sys
found = {}
for path in sys.argv[1:]:
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    found[path] = sorted(names)
print(json.dumps(found))
"""


@cache
def _imports_of(package: str) -> dict[Path, list[str]]:
    paths = [str(path) for path in _sources(package)]
    out = subprocess.run(
        [sys.executable, "-c", _LIST_IMPORTS, *paths],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {Path(path): names for path, names in json.loads(out).items()}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_the_dependency_direction(package: str) -> None:
    offences = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, names in _imports_of(package).items()
        if path != COMPOSITION_ROOT
        for name in names
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[package])
    ]
    assert offences == []


def test_the_packages_exist() -> None:
    assert all(_sources(package) for package in FORBIDDEN)
