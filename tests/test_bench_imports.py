"""Every benchmark module imports: bench/ is a package whose modules refer to each other
by their package paths, so a refactor that breaks one shows here and not on the GPU."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import bench

BENCH_DIR = Path(bench.__file__).parent
MODULES = sorted(info.name for info in pkgutil.walk_packages([str(BENCH_DIR)], prefix="bench."))


def test_every_group_is_found() -> None:
    groups = {name.split(".")[1] for name in MODULES}
    assert groups == {"common", "disaggregation", "engine", "offload", "routing", "serving"}
    # Every .py file below bench/ (but results/) is one of the modules imported below.
    files = {
        ".".join(("bench", *p.relative_to(BENCH_DIR).with_suffix("").parts))
        for p in BENCH_DIR.rglob("*.py")
        if p.name != "__init__.py"
    }
    assert files <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no docstring"


def test_no_module_imports_a_top_level_sibling() -> None:
    """``import engine_cuda``-style imports only worked with bench/ itself on sys.path."""
    stems = {p.stem for p in BENCH_DIR.rglob("*.py")} - {"__init__"}
    for path in BENCH_DIR.rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from"):
                assert words[1].split(".")[0] not in stems, f"{path}: {line}"
