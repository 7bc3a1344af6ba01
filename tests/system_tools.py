"""System programs some tests drive for real (Chromium, Prometheus, sshd, ...).

A missing one FAILS the test that needs it, naming the Debian package: these tests never
skip silently. ``make test`` (``.ci/run`` too) installs the packages where it can (root
with apt); see the Makefile's ``system-deps`` target.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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
