"""bench.engine.clocks_probe end to end on a CPU (a tiny random Llama, small products):
the probe a device call runs, checked here before device time is spent on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine import clocks_probe


@pytest.mark.slow
def test_probe_runs_every_phase_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "clocks.json"
    clocks_probe.main(
        ["--device", "cpu", "--random-model", "llama-tiny", "--prefill-lens", "64",
         "--max-batched-tokens", "256", "--batches", "2", "--prompt-len", "16",
         "--new-tokens", "4", "--skip-hf", "--sustain-s", "0.3", "--matmul-n", "128",
         "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["burst_tflop_s"] > 0 and report["burst_after_tflop_s"] > 0
    assert report["sustained_window_tflop_s"] and report["sustained_settled_tflop_s"] > 0
    prefill = report["prefill"]["64"]
    assert prefill["seconds"] > 0
    assert prefill["of_burst_rate"] == pytest.approx(
        prefill["model_tflop_s"] / report["burst_tflop_s"]
    )
    assert report["decode_step_ms"]["2"] > 0
    phases = [row["phase"] for row in report["clocks"]]
    assert phases == [
        "idle",
        "matmul burst (roofline's)",
        "matmul sustained 0.3 s",
        "prefill 64",
        "decode batch 2",
        "matmul burst again",
    ]
