"""The roofline at the SM clock each phase ran at (issue 19), beside the issue's roofline.

The roofline's matrix rate (``cuda.matmul_rate``) is timed as a ~20 ms burst, short enough
that the GPU runs it at the clock of the copy and idle before it; a long compute-heavy
phase (decode at 256 rows, an 8k prefill) holds the power cap and runs at a lower SM clock
(``gpu_clocks``). A GPU's matrix rate is proportional to its SM clock, so the rate a phase
could have reached is the burst's times the phase's mean clock over the burst's clock
(``burst_clock``): for a batch, its runs' decode phases (``throughput`` marks each run's prefill
and decode apart), for the prefill rows, the prefill phase. The roofline with that rate
tells how much of a step's distance from the issue's roofline is the clock and how much
the kernels. The burst (~20 ms, shorter than the power cap takes to act) is taken to run at
the highest clock sampled in its phase; a burst shorter than the sampling interval is not
seen alone.

The issue's goals stay judged against the burst rate (``ThroughputRow.roofline_fraction``);
this is a second column, not a new goal.

``python -m bench.engine.clock_roofline RESULT.json`` prints both for a
``bench.engine.throughput`` result whose JSON holds ``gpu_clocks`` (a CUDA run with
``nvidia-smi``); a result without clocks says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.engine.cuda import RANDOM_MODELS
from bench.engine.floors import DecodeShape, decode_floors

RATES_PHASE = "copy bandwidth, matmul rate (the roofline's)"  # the phase throughput marks


def batch_phase(batch: int, burst: int = 1) -> str:
    """The name ``throughput`` gives a batch's phases ("batch 64", then " prefill" or
    " decode" for each run's)."""
    return f"batch {batch}" + (f" burst {burst}" if burst > 1 else "")


def phase_clocks(clocks: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase name's mean SM clock (MHz) over its sampled spans (a name marked once
    per run, as the decode phases are, is pooled by samples)."""
    pooled: dict[str, tuple[float, int]] = {}
    for row in clocks:
        if row.get("samples"):
            total, count = pooled.get(row["phase"], (0.0, 0))
            pooled[row["phase"]] = (
                total + row["sm_mhz_mean"] * row["samples"],
                count + row["samples"],
            )
    return {name: total / count for name, (total, count) in pooled.items()}


def burst_clock(clocks: list[dict[str, Any]]) -> float | None:
    """The clock the matmul burst ran at: the highest sampled in the burst phase (the GPU
    idles at a low clock before it, 345 MHz on the H200, so the phase's mean says
    nothing), else the GPU's maximum (results sampled before ``sm_mhz_peak`` existed)."""
    rows = [row for row in clocks if row.get("samples") and row["phase"] == RATES_PHASE]
    if not rows:
        return None
    return max(float(row.get("sm_mhz_peak", row["max_sm_mhz"])) for row in rows)


def clock_ratio(clocks: dict[str, float], burst: float | None, phase: str) -> float | None:
    """The phase's mean clock over the burst's; None if either went unsampled."""
    ran = clocks.get(phase)
    return ran / burst if burst and ran else None


def shape_of(report: dict[str, Any]) -> DecodeShape:
    """The decode shape of a random-model result (the model name is its shape's)."""
    hf = RANDOM_MODELS[report["model"]]
    heads = hf["num_attention_heads"]
    return DecodeShape(
        hidden=hf["hidden_size"],
        intermediate=hf["intermediate_size"],
        layers=hf["num_hidden_layers"],
        heads=heads,
        kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim", hf["hidden_size"] // heads),
        vocab=hf["vocab_size"],
    )


def decode_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch: the step, the issue's roofline and the roofline at the phase's clock."""
    clocks = phase_clocks(report.get("gpu_clocks", []))
    burst = burst_clock(report.get("gpu_clocks", []))
    shape = shape_of(report)
    bandwidth = report["copy_bandwidth_gb_s"] * 1e9
    rate = report["bf16_matmul_tflop_s"] * 1e12
    rows = []
    for row in report["throughput"]:
        step, context = row["decode_step_ms"], row["decode_mean_context"]
        if not step or not context:
            continue
        phase = batch_phase(row["batch"], row["decode_burst"]) + " decode"
        ratio = clock_ratio(clocks, burst, phase)
        roof = decode_floors(shape, row["batch"], context, bandwidth, rate).roofline_s * 1e3
        at_clock = None
        if ratio is not None:
            floors = decode_floors(shape, row["batch"], context, bandwidth, rate * ratio)
            at_clock = floors.roofline_s * 1e3
        rows.append({
            "batch": row["batch"], "step_ms": step, "roofline_ms": roof, "of_roofline": roof / step,
            "clock_ratio": ratio, "roofline_at_clock_ms": at_clock,
            "of_roofline_at_clock": at_clock / step if at_clock else None,
        })  # fmt: skip
    return rows


def prefill_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per prefill length: its share of the burst rate and of the rate at its clock."""
    clocks = phase_clocks(report.get("gpu_clocks", []))
    prefill = report.get("prefill") or []
    phase = "prefill " + ",".join(str(p["prompt_len"]) for p in prefill)
    ratio = clock_ratio(clocks, burst_clock(report.get("gpu_clocks", [])), phase)
    rows = []
    for p in prefill:
        share = p.get("of_matmul_rate")
        at_clock = share / ratio if ratio and share else None
        rows.append({"prompt_len": p["prompt_len"], "of_matmul_rate": share,
                     "clock_ratio": ratio, "of_rate_at_clock": at_clock})  # fmt: skip
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_rows(decode: list[dict[str, Any]], prefill: list[dict[str, Any]]) -> str:
    lines = ["batch  step ms  roofline ms (of it)  clock/burst  at the clock ms (of it)"]
    for r in decode:
        at = "-" if r["roofline_at_clock_ms"] is None else f"{r['roofline_at_clock_ms']:.2f}"
        ratio = "-" if r["clock_ratio"] is None else f"{r['clock_ratio']:.3f}"
        roof = f"{r['roofline_ms']:.2f} ({_pct(r['of_roofline'])})"
        lines.append(f"{r['batch']:>5} {r['step_ms']:>8.2f} {roof:>20} {ratio:>12} "
                     f"{at:>15} ({_pct(r['of_roofline_at_clock'])})")  # fmt: skip
    for p in prefill:
        ratio = "-" if p["clock_ratio"] is None else f"{p['clock_ratio']:.3f}"
        shares = f"{_pct(p['of_matmul_rate'])} of the burst rate"
        at = f"{_pct(p['of_rate_at_clock'])} at its clock"
        lines.append(f"prefill {p['prompt_len']}: {shares}; clock/burst {ratio}: {at}")
    return "\n".join(lines)


def clock_report(report: dict[str, Any]) -> str:
    """The table of a throughput result (``decode_rows``, ``prefill_rows``)."""
    if not report.get("gpu_clocks"):
        return "no gpu_clocks in this result (a CPU run, or no nvidia-smi)"
    return format_rows(decode_rows(report), prefill_rows(report))


def main(argv: list[str] | None = None) -> None:
    for name in sys.argv[1:] if argv is None else argv:
        print(f"{name}:\n{clock_report(json.loads(Path(name).read_text()))}")


if __name__ == "__main__":
    main()
