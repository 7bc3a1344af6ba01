"""System programs some tests drive for real (Chromium, Prometheus, sshd, ...), and the
optional Python packages they import (UCXX).

A missing one FAILS the test that needs it, naming the Debian package (or the wheel):
these tests never skip silently. ``make test`` (``.ci/run`` too) installs the packages
where it can (root with apt; see the Makefile's ``system-deps`` target) and the wheels with
the dev extras (``ucxx-cu12`` installs and runs on a CPU-only machine: UCX moves the bytes
over TCP and shared memory).
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType

import pytest

# program -> the Debian package that provides it (the Makefile's list is the same).
PACKAGES = {
    "chromium": "chromium",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
}


def require(program: str) -> str:
    """The path of ``program``; fails the calling test if it is not installed."""
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/usr/bin:/sbin")
    if path is None:
        name = Path(program).name
        package = PACKAGES.get(name, name)
        pytest.fail(
            f"{program} is not installed: `apt-get install -y {package}` (or `make "
            "system-deps` as root) - this test runs the real program and does not skip",
            pytrace=False,
        )
    return path


def require_module(name: str, wheel: str) -> ModuleType:
    """The module ``name``; fails the calling test, naming ``wheel``, if it is missing."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.fail(
            f"{name} is not importable ({exc}): `pip install {wheel}` (the dev extras, "
            "`make test`, install it) - this test runs it for real and does not skip",
            pytrace=False,
        )
