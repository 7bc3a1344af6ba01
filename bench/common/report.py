"""What every benchmark's JSON records besides its rows: the code measured, the machine,
and an atomic write of the file."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def code_version(repo: Path) -> dict[str, Any]:
    """The commit measured, and which files outside ``bench/`` differed from it."""
    git = ["git", "-C", str(repo)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    changed = [line[3:] for line in status.stdout.splitlines() if not line[3:].startswith("bench/")]
    return {"commit": commit.stdout.strip() or None, "changed_outside_bench": changed}


def machine_facts(load_start: tuple[float, float, float]) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
    }


def write_json(path: Path, document: Any, picture: bool = True) -> None:
    """Writes a result, and its PNG beside it (``plots.plot``) unless ``picture`` is off."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)
    if picture:
        from bench.common.plots import plot  # matplotlib: only when a result is written

        print(f"wrote {plot(path)}")
