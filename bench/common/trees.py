"""Other checkouts of dynask, for benchmarks that run a base tree beside this one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.common.paths import REPO

PACKAGES = ("kv", "actors", "control_plane", "web", "migrations")


def archive_tree(ref: str, folder: Path) -> Path:
    """The files of git ``ref`` of this repository, unpacked into ``folder``."""
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, stdout=-1)
    subprocess.run(["tar", "x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def dynask_namespace(tree: Path, scratch: Path) -> Path:
    """A folder under ``scratch`` that, put first on ``PYTHONPATH``, makes ``dynask.*``
    resolve to ``tree``'s packages (as the Makefile's namespace does for mypy)."""
    root = scratch / f"ns-{abs(hash(str(tree.resolve())))}"
    (root / "dynask").mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        link = root / "dynask" / package
        if not link.exists():
            link.symlink_to(tree.resolve() / package)
    return root
