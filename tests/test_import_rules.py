"""The dependency direction kv <- actors <- control_plane <- web, checked on the source.

``kv`` imports nothing of the project and no framework; ``actors`` never imports
Starlette, SQLAlchemy, the control plane or the web UI; ``web`` is imported only by the
CLI (the composition root).
"""

from __future__ import annotations

import ast
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


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_the_dependency_direction(package: str) -> None:
    offences = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(package)
        if path != COMPOSITION_ROOT
        for name in sorted(_imports(path))
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[package])
    ]
    assert offences == []


def test_the_packages_exist() -> None:
    assert all(_sources(package) for package in FORBIDDEN)
