"""bench.engine.throughput end to end on a CPU (a tiny random Llama, no HF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine import throughput
from bench.engine.clock_roofline import RATES_PHASE
from bench.engine.gpu_clocks import ClockLog


@pytest.mark.slow
def test_throughput_measures_each_batch_and_writes_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs: list[ClockLog] = []

    class KeptClockLog(ClockLog):
        def __enter__(self) -> ClockLog:
            logs.append(self)
            return super().__enter__()

    monkeypatch.setattr(throughput, "ClockLog", KeptClockLog)
    out = tmp_path / "engine.json"
    throughput.main(
        ["--device", "cpu", "--random-model", "llama-tiny", "--batches", "1,2",
         "--prompt-len", "16", "--new-tokens", "4", "--ttft-prompt-len", "32",
         "--ttft-trials", "1", "--skip-hf", "--repeats", "2", "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    rows = report["throughput"]
    assert [row["batch"] for row in rows] == [1, 2]
    for row in rows:
        assert len(row["ours_runs_tok_s"]) == 2 and row["ours_tok_s"] == max(row["ours_runs_tok_s"])
        assert row["decode_step_ms"] > 0 and row["hf_tok_s"] is None
    assert report["ttft"]["cold_ms"] > 0 and report["ttft"]["prompt_len"] == 32
    assert "gpu_clocks" not in report  # no nvidia-smi here: no samples, no section
    assert not out.with_suffix(".smi.csv").exists()
    # Each run's prefill and decode are phases of their own (the decode's clock is its own).
    runs = ["prefill", "decode"] * 2
    assert [name for name, _, _ in logs[0].phases] == [
        RATES_PHASE, "engine start-up, warm-up",
        *(f"batch 1 {p}" for p in runs), *(f"batch 2 {p}" for p in runs),
    ]  # fmt: skip
