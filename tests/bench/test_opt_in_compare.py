"""bench.engine.opt_in_compare: the on / off ratios of two throughput reports."""

from __future__ import annotations

import json
from pathlib import Path

from bench.engine import opt_in_compare


def _report(tok_s: float, decode: float | None, prefill: float, cached_ms: float) -> dict:
    return {
        "throughput": [{"batch": 1, "ours_tok_s": tok_s, "ours_decode_tok_s": decode}],
        "prefill": [{"prompt_len": 8192, "tok_s": prefill}],
        "ttft": {"prompt_len": 4096, "cold_ms": 100.0, "cached_ms": cached_ms},
    }


def test_rows_hold_off_on_and_their_ratio(tmp_path: Path) -> None:
    off, on = _report(100.0, 110.0, 4000.0, 20.0), _report(125.0, None, 5000.0, 10.0)
    on["skinny_matmul"] = {"1x6144x4096 bfloat16 norm": "cublas"}
    paths = [tmp_path / "off.json", tmp_path / "on.json"]
    for path, report in zip(paths, (off, on), strict=True):
        path.write_text(json.dumps(report))

    opt_in_compare.main([str(paths[0]), str(paths[1]), "--out", str(tmp_path / "r.json")])

    result = json.loads((tmp_path / "r.json").read_text())
    assert [(r["measure"], r["on_over_off"]) for r in result["rows"]] == [
        ("batch 1 tok/s", 1.25),
        ("prefill 8192 tok/s", 1.25),
        ("TTFT 4096 cold ms", 1.0),
        ("TTFT 4096 cached ms", 0.5),
    ]
    assert result["skinny_matmul"] == {"1x6144x4096 bfloat16 norm": "cublas"}
