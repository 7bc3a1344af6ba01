"""bench.engine.clock_roofline: the decode roofline and the prefill share at each phase's
SM clock, on hand-built throughput results (the tiny random Llama's shape)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.engine import clock_roofline
from bench.engine.floors import decode_floors

RATES = clock_roofline.RATES_PHASE


def _clock(phase: str, mhz: float) -> dict[str, Any]:
    return {"phase": phase, "seconds": 1.0, "samples": 10, "sm_mhz_mean": mhz,
            "sm_mhz_peak": mhz, "max_sm_mhz": 1980.0}  # fmt: skip


def _report(bandwidth_gb_s: float, tflop_s: float, clocks: list[dict[str, Any]]) -> dict[str, Any]:
    row = {"batch": 8, "decode_burst": 1, "decode_step_ms": 2.0, "decode_mean_context": 100.0}
    return {
        "model": "llama-tiny",
        "copy_bandwidth_gb_s": bandwidth_gb_s,
        "bf16_matmul_tflop_s": tflop_s,
        "throughput": [row, {**row, "batch": 16, "decode_step_ms": None}],
        "prefill": [{"prompt_len": 64, "of_matmul_rate": 0.6}],
        "gpu_clocks": clocks,
    }


def test_compute_bound_roofline_scales_with_the_clock() -> None:
    # Bandwidth so large that every op is compute-bound: the roofline is FLOPs over the rate.
    clocks = [_clock(RATES, 2000.0), _clock("batch 8 decode", 1500.0), _clock("prefill 64", 1600.0)]
    report = _report(1e15, 1e-3, clocks)
    (row,) = clock_roofline.decode_rows(report)  # the row without a step is left out
    shape = clock_roofline.shape_of(report)
    flops = decode_floors(shape, 8, 100.0, 1e24, 1e9).flops
    assert row["roofline_ms"] == pytest.approx(flops / 1e9 * 1e3)
    assert row["clock_ratio"] == 0.75
    assert row["roofline_at_clock_ms"] == pytest.approx(row["roofline_ms"] / 0.75)
    assert row["of_roofline_at_clock"] == pytest.approx(row["roofline_ms"] / 0.75 / 2.0)
    (prefill,) = clock_roofline.prefill_rows(report)
    assert prefill["clock_ratio"] == 0.8
    assert prefill["of_rate_at_clock"] == pytest.approx(0.6 / 0.8)


def test_memory_bound_roofline_ignores_the_clock() -> None:
    clocks = [_clock(RATES, 2000.0), _clock("batch 8 decode", 1000.0)]
    (row,) = clock_roofline.decode_rows(_report(1.0, 1e9, clocks))
    assert row["clock_ratio"] == 0.5
    assert row["roofline_at_clock_ms"] == pytest.approx(row["roofline_ms"])


def test_unsampled_phases_give_no_clock_column(tmp_path: Path, capsys: Any) -> None:
    clocks = [_clock(RATES, 2000.0), {"phase": "batch 8 decode", "seconds": 0.01, "samples": 0}]
    report = _report(1.0, 1.0, clocks)
    (row,) = clock_roofline.decode_rows(report)
    assert row["clock_ratio"] is None and row["of_roofline_at_clock"] is None
    assert clock_roofline.prefill_rows(report)[0]["of_rate_at_clock"] is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**report, "gpu_clocks": []}))
    clock_roofline.main([str(path)])
    assert "no gpu_clocks" in capsys.readouterr().out


def test_a_phase_marked_once_per_run_is_pooled_by_samples() -> None:
    runs = [{**_clock("batch 8 decode", 1200.0), "samples": 30}, _clock("batch 8 decode", 1800.0)]
    clocks = clock_roofline.phase_clocks([*runs, _clock("batch 8 prefill", 900.0)])
    assert clocks["batch 8 decode"] == (1200.0 * 30 + 1800.0 * 10) / 40
    assert clocks["batch 8 prefill"] == 900.0


def test_the_burst_runs_at_the_highest_clock_of_its_phase() -> None:
    # The GPU idles at 345 MHz before the burst: the phase's mean is not the burst's clock.
    rates = {**_clock(RATES, 890.0), "sm_mhz_peak": 1980.0}
    assert clock_roofline.burst_clock([rates, _clock("batch 8 decode", 1650.0)]) == 1980.0
    # A result sampled before the peak was recorded falls back to the GPU's maximum clock.
    older = {k: v for k, v in _clock(RATES, 890.0).items() if k != "sm_mhz_peak"}
    assert clock_roofline.burst_clock([{**older, "max_sm_mhz": 1755.0}]) == 1755.0
    assert clock_roofline.burst_clock([_clock("batch 8 decode", 1650.0)]) is None
