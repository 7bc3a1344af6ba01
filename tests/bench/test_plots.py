"""bench/common/plots.py: a PNG beside each benchmark result, for each kind of result."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
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
    assert "other.json: no table of numbers to draw" in done.stderr


def _picture_of(result: Path) -> bytes:
    from bench.common.plots import plot

    return plot(result).read_bytes()[:8]


def test_every_stored_result_gets_a_picture(tmp_path: Path) -> None:
    copies = [Path(shutil.copy(r, tmp_path / r.name)) for r in sorted(RESULTS.glob("*.json"))]
    context = multiprocessing.get_context("spawn")  # no fork of the test process's threads
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
        magics = dict(zip((c.name for c in copies), pool.map(_picture_of, copies), strict=True))
    assert magics == {c.name: PNG_MAGIC for c in copies}


def test_a_result_without_its_own_figure_is_drawn_from_its_tables() -> None:
    from bench.common.plots import result_tables, row_label, table_metrics

    data = {
        "machine": {"cpu_count": 2},
        "rows": [
            {"mode": "kv", "batch": 8, "repeats": 3, "tok_s": 10.5, "load": {"ttft_p50_ms": 4.0}},
            {"mode": "random", "batch": 8, "repeats": 3, "tok_s": 9.0, "load": {"ttft_p50_ms": 7}},
        ],
        "summary": {"runs": [{"name": "a", "gbps": 1.5, "ok": True}]},
    }
    tables = result_tables(data)
    assert [name for name, _ in tables] == ["rows", "summary.runs"]
    rows = tables[0][1]
    assert rows[0] == {
        "mode": "kv",
        "batch": 8,
        "repeats": 3,
        "tok_s": 10.5,
        "load.ttft_p50_ms": 4.0,
    }
    assert table_metrics(rows) == ["tok_s", "load.ttft_p50_ms"]  # counts and labels are not
    assert [row_label(r, i) for i, r in enumerate(rows)] == ["kv / batch 8", "random / batch 8"]
    assert table_metrics(tables[1][1]) == ["gbps"]  # a bool is no number
    assert result_tables({"result": {"setup_s": 1.2, "nested": {"p99_us": 3}}}) == [
        ("result", [{"setup_s": 1.2, "nested.p99_us": 3}])
    ]


def test_writing_a_result_writes_its_png_beside_it(tmp_path: Path) -> None:
    from bench.common.report import write_json

    out = tmp_path / "x.json"
    write_json(out, {"rows": [{"mode": "a", "req_per_s": 2.0}, {"mode": "b", "req_per_s": 3.0}]})
    assert json.loads(out.read_text())["rows"][1] == {"mode": "b", "req_per_s": 3.0}
    assert (tmp_path / "x.png").read_bytes()[:8] == PNG_MAGIC
