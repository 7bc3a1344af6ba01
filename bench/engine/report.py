"""Result types and reporting of ``bench.engine.throughput``: rows, goals, table, JSON."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class BenchConfig:
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    ttft_prompt_len: int
    ttft_trials: int
    repeats: int
    threads: int
    skip_hf: bool
    device: str = "cpu"
    dtype: str = "auto"
    random_model: str | None = None
    tokenizer: str | None = None
    hf_batches: tuple[int, ...] | None = None  # None: every batch size
    prefill_lens: tuple[int, ...] = ()
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.9
    vllm: bool = False  # also run out=vllm on the same prompts (engine_vllm.py)
    decode_bursts: tuple[int, ...] = (1,)  # the engine's decode_burst, one pass per value
    async_scheduling: str = "auto"  # the engine's: auto (on for CUDA), on, off
    cuda_fast_paths: bool = True  # the engine's (CUDA only; off: the kernels of before)


@dataclass(frozen=True)
class OursRun:
    seconds: float
    decode_tok_s: float | None  # None when there is no decode phase (one new token)
    outputs: list[list[int]]
    decode_step_ms: float | None = None  # mean wall time of a decode-phase step
    prefill_phase_s: float | None = None  # until every sequence had its first token
    prefill_steps_ms: tuple[float, ...] = ()  # each step of that phase
    decode_model_steps: int = 0  # model steps of the decode phase (a burst of k counts k)
    decode_calls: int = 0  # engine.step() calls of the decode phase
    decode_mean_context: float | None = None  # mean context of the rows of those steps


@dataclass(frozen=True)
class HFRun:
    seconds: float
    outputs: list[list[int]]


@dataclass(frozen=True)
class ThroughputRow:
    """One batch size; the rates are the best of the repeats (the least disturbed run)."""

    batch: int
    ours_tok_s: float
    decode_burst: int
    hf_tok_s: float | None
    ratio: float | None
    ours_decode_tok_s: float | None
    rows_matching_hf: int | None  # rows whose greedy tokens equal HF's exactly
    rows_compared: int
    ours_runs_tok_s: list[float]
    hf_runs_tok_s: list[float]
    decode_step_ms: float | None = None
    prefill_phase_s: float | None = None
    prefill_steps_ms: tuple[float, ...] = ()
    first_divergences: list[int] | None = None  # per differing row: first differing index
    floor_step_ms: float | None = None  # memory floor of one decode step (GPU runs)
    floor_fraction: float | None = None  # floor / measured step time
    decode_model_steps: int | None = None  # of the run whose step time is reported
    decode_calls: int | None = None
    decode_mean_context: float | None = None
    roofline_step_ms: float | None = None  # sum over ops of max(bytes/bw, FLOPs/rate)
    roofline_fraction: float | None = None  # roofline / measured step time
    roofline_per_op_ms: dict[str, float] | None = None


@dataclass(frozen=True)
class FirstToken:
    seconds: float
    cached_tokens: int


@dataclass(frozen=True)
class TTFTResult:
    prompt_len: int
    trials: int
    cold_ms: float
    cached_ms: float
    speedup: float
    cached_tokens: int


def evaluate_goals(
    rows: list[ThroughputRow], ttft: TTFTResult, device: str = "cpu"
) -> dict[str, bool | None]:
    """The issue's targets; None where this run did not measure what a goal needs."""
    rows = [row for row in rows if rows and row.decode_burst == rows[0].decode_burst]
    ratio = {row.batch: row.ratio for row in rows}
    by_batch = {row.batch: row for row in rows}

    def at_least(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target

    if device.startswith("cuda"):
        one = by_batch.get(1)
        return {
            "batch1_decode_ge_80pct_of_floor": at_least(one.floor_fraction if one else None, 0.8),
            "batch1_decode_ge_210_tok_s": at_least(one.ours_decode_tok_s if one else None, 210.0),
            "batch64_ge_8x_hf": at_least(ratio.get(64), 8.0),
        }
    return {
        "ratio_batch32_ge_2": at_least(ratio.get(32), 2.0),
        "ratio_batch1_ge_1": at_least(ratio.get(1), 1.0),
        "ttft_speedup_ge_5": at_least(ttft.speedup, 5.0),
    }


def machine_facts() -> dict[str, Any]:
    import transformers

    return {
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers_version": transformers.__version__,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
    }


# ---- output -------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(
    rows: list[ThroughputRow], ttft: TTFTResult, goals: dict[str, bool | None], config: BenchConfig
) -> str:
    lines = [
        f"Throughput: {config.prompt_len}-token prompts, {config.new_tokens} new tokens, "
        f"greedy, best of {config.repeats}, {config.threads} torch threads",
        f"{'batch':>5}  {'burst':>5}  {'ours tok/s':>10}  {'HF tok/s':>10}  {'ours/HF':>7}  "
        f"{'ours decode tok/s':>17}  {'rows = HF':>9}  {'step ms':>7}  {'steps/call':>10}  "
        f"{'mem floor':>9}  {'of mem':>6}  {'roofline':>8}  {'of roof':>7}",
    ]
    for row in rows:
        matching = "-"
        if row.rows_matching_hf is not None:
            matching = f"{row.rows_matching_hf}/{row.rows_compared}"
        lines.append(
            f"{row.batch:>5}  {row.decode_burst:>5}  {row.ours_tok_s:>10.1f}  "
            f"{_fmt(row.hf_tok_s, '.1f'):>10}  "
            f"{_fmt(row.ratio, '.2f'):>7}  {_fmt(row.ours_decode_tok_s, '.1f'):>17}  "
            f"{matching:>9}  {_fmt(row.decode_step_ms, '.2f'):>7}  {_steps_per_call(row):>10}  "
            f"{_fmt(row.floor_step_ms, '.2f'):>9}  {_fmt(row.floor_fraction, '.0%'):>6}  "
            f"{_fmt(row.roofline_step_ms, '.2f'):>8}  {_fmt(row.roofline_fraction, '.0%'):>7}"
        )
    lines += [
        "",
        f"TTFT: {ttft.prompt_len}-token prompt, median of {ttft.trials}",
        f"{'cold ms':>9}  {'cached ms':>9}  {'speed-up':>8}  {'cached tokens':>13}",
        f"{ttft.cold_ms:>9.1f}  {ttft.cached_ms:>9.1f}  {ttft.speedup:>7.1f}x  "
        f"{ttft.cached_tokens:>13}",
        "",
        "Goals",
    ]
    for name, met in goals.items():
        verdict = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"  {name:<20}  {verdict}")
    return "\n".join(lines)


def _steps_per_call(row: ThroughputRow) -> str:
    if not row.decode_calls or row.decode_model_steps is None:
        return "-"
    return f"{row.decode_model_steps / row.decode_calls:.2f}"


def write_json(path: Path, report: dict[str, Any]) -> None:
    """The result and its PNG beside it (``bench.common.plots``)."""
    from bench.common.report import write_json as write_result

    write_result(path, report)


def print_gpu_extras(extra: dict[str, Any]) -> None:
    for result in extra.get("prefill", []):
        seconds = result["seconds"]
        share = result.get("of_matmul_rate")
        of_rate = "" if share is None else f", {share:.1%} of the bf16 matrix rate"
        print(f"prefill {result['prompt_len']:>5} tokens: {result['tok_s']:>9.0f} tok/s "
              f"({seconds * 1e3:.1f} ms{of_rate})")  # fmt: skip
    print(
        f"copy bandwidth {extra['copy_bandwidth_gb_s']:.0f} GB/s; bf16 matmul "
        f"{extra.get('bf16_matmul_tflop_s', 0):.0f} TFLOP/s; KV cache {extra['kv_cache']}"
    )


def first_divergences(ours_runs: list[OursRun], hf_runs: list[HFRun]) -> list[int]:
    """For each row that differs from HF: the index of its first differing token."""
    found = []
    for ours_run, hf_run in zip(ours_runs, hf_runs, strict=True):
        for ours, hf in zip(ours_run.outputs, hf_run.outputs, strict=True):
            if ours != hf:
                pairs = enumerate(zip(ours, hf, strict=False))
                found.append(next((i for i, (a, b) in pairs if a != b), min(len(ours), len(hf))))
    return found


def matching_rows(ours_runs: list[OursRun], hf_runs: list[HFRun]) -> int:
    """How many rows of greedy output are token for token the same as HF's."""
    return sum(
        ours == hf
        for ours_run, hf_run in zip(ours_runs, hf_runs, strict=True)
        for ours, hf in zip(ours_run.outputs, hf_run.outputs, strict=True)
    )


def summarize_batch(
    batch: int, new_tokens: int, ours_runs: list[OursRun], hf_runs: list[HFRun], burst: int = 1
) -> ThroughputRow:
    generated = batch * new_tokens
    ours_rates = [generated / run.seconds for run in ours_runs]
    hf_rates = [generated / run.seconds for run in hf_runs]
    decode_rates = [run.decode_tok_s for run in ours_runs if run.decode_tok_s is not None]
    step_times = [run.decode_step_ms for run in ours_runs if run.decode_step_ms is not None]
    best = min(
        (run for run in ours_runs if run.decode_step_ms is not None),
        key=lambda run: run.decode_step_ms or 0.0,
        default=None,
    )
    ours_best = max(ours_rates)
    hf_best = max(hf_rates) if hf_rates else None
    return ThroughputRow(
        batch=batch,
        decode_burst=burst,
        ours_tok_s=ours_best,
        hf_tok_s=hf_best,
        ratio=ours_best / hf_best if hf_best else None,
        ours_decode_tok_s=max(decode_rates) if decode_rates else None,
        rows_matching_hf=matching_rows(ours_runs, hf_runs) if hf_runs else None,
        rows_compared=batch * len(hf_runs),
        ours_runs_tok_s=ours_rates,
        hf_runs_tok_s=hf_rates,
        decode_step_ms=min(step_times) if step_times else None,
        prefill_steps_ms=ours_runs[0].prefill_steps_ms,
        prefill_phase_s=min(
            (r.prefill_phase_s for r in ours_runs if r.prefill_phase_s), default=None
        ),
        first_divergences=first_divergences(ours_runs, hf_runs) if hf_runs else None,
        decode_model_steps=best.decode_model_steps if best else None,
        decode_calls=best.decode_calls if best else None,
        decode_mean_context=best.decode_mean_context if best else None,
    )
