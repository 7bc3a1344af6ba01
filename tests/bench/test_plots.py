"""bench/common/plots.py: a PNG beside each benchmark result, for each kind of result."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLOTS = Path(__file__).resolve().parents[2] / "bench" / "common" / "plots.py"
RESULTS = PLOTS.parents[1] / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["engine.json", "routing.json", "serve.json", "trace_replay.json"])
def test_a_png_is_written_beside_the_json(name: str, tmp_path: Path) -> None:
    result = shutil.copy(RESULTS / name, tmp_path / name)
    done = subprocess.run(
        [sys.executable, str(PLOTS), str(result)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    png = tmp_path / name.replace(".json", ".png")
    assert done.stdout == f"wrote {png}\n"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_another_json_is_refused_by_name(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    done = subprocess.run(
        [sys.executable, str(PLOTS), str(other)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "not a result of engine.py, routing.py or serve.py" in done.stderr
