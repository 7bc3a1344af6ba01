"""Benchmark of the built-in engine (CPU or CUDA), against HF transformers in the same run.

What it measures, with the default SmolLM2-135M-Instruct model:

* Output throughput at batch 1, 8 and 32: prompts of random token ids (a fixed seed per
  batch size), greedy decoding of a fixed number of new tokens (EOS ignored). Throughput
  is ``batch * new_tokens / wall seconds`` end to end, prefill included, for our engine
  and for ``transformers`` ``generate``. Each batch size runs ours then HF back to back,
  so a noisy shared machine slows both alike; the ratio ours/HF is what to compare.
  With ``--repeats N`` each side keeps its best run (fresh prompts each time, so our
  prefix cache never helps). Our decode-only rate (tokens after every sequence has its
  first one) is reported too, and how many rows match HF's greedy tokens exactly. A row
  may differ without a bug: HF's ``min_new_tokens`` masks EOS, while ``ignore_eos`` lets
  our engine pick EOS (and carry on) where it is the argmax.
* Time to first token of a long prompt: cold (a fresh prompt), then the same prompt
  again, whose full blocks are now in the prefix cache. The median of a few trials.

The goals from the issue are evaluated at the end: ratio >= 2 at batch 32, ratio >= 1 at
batch 1, TTFT speed-up >= 5 with a cached prefix.

Run it from the repository root (about ten minutes on two cores)::

    .venv/bin/python -m bench.engine.throughput            # full run
    .venv/bin/python -m bench.engine.throughput --quick    # smoke: batches 1,8; 32 new tokens
    .venv/bin/python -m bench.engine.throughput --skip-hf  # our engine only
    .venv/bin/python -m bench.engine.throughput --vllm     # and out=vllm on the same prompts

It prints a table and writes JSON to ``bench/results/engine.json`` (``--out`` to change).

On a GPU (``--device cuda``), typically with ``--random-model llama-8b`` (a random bf16
model of Llama-3.1-8B's shape, built in memory; see ``engine_cuda.py``)::

    python -m bench.engine.throughput --device cuda --random-model llama-8b \
        --tokenizer PATH --batches 1,16,64,256 --prompt-len 512 --prefill-lens 512,8192

it also reports the time per decode step against the memory floor (weights plus the KV
read per step, over the copy bandwidth measured in the same run) and prefill tokens/s.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import torch

from bench.engine import cuda as engine_cuda
from bench.engine import vllm_side as engine_vllm
from bench.engine.args import parse_args
from bench.engine.clock_roofline import RATES_PHASE, batch_phase, clock_report
from bench.engine.floors import DecodeShape, decode_floors
from bench.engine.gpu_clocks import ClockLog, clock_table
from bench.engine.hf_side import load_hf_model, run_hf
from bench.engine.report import (
    BenchConfig,
    FirstToken,
    HFRun,
    OursRun,
    ThroughputRow,
    TTFTResult,
    evaluate_goals,
    format_table,
    machine_facts,
    print_gpu_extras,
    summarize_batch,
    write_json,
)
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.cuda import gated_gemm, skinny_matmul
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.engine_parts import build_engine_parts_from_hf
from dynask.actors.models.model_source import resolve_model

TOKEN_ID_RANGE = (100, 40_000)  # plain vocabulary ids, clear of the special tokens
SEED = 20_240_601
TTFT_SEED = SEED + 10_000_000  # apart from the batch prompts, so nothing is cached by chance


# ---- prompts ------------------------------------------------------------------------------


def random_prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` random token ids; the same seed gives the same ids."""
    generator = torch.Generator().manual_seed(seed)
    low, high = TOKEN_ID_RANGE
    return torch.randint(low, high, (batch, length), generator=generator).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# ---- our engine ---------------------------------------------------------------------------


def run_ours(
    engine: LLMEngine,
    prompts: list[list[int]],
    new_tokens: int,
    phase: Callable[[str | None], None] | None = None,
) -> OursRun:
    """Runs the prompts to completion with the step API, timing the decode phase apart.

    The decode phase starts once every sequence has its first token. Its per-step time is
    the phase's wall time over the model steps it ran (the engine's step counter: a burst
    of ``k`` steps counts ``k``), not over ``engine.step()`` calls; the mean context is
    that of the rows of each model step, i.e. the KV the steps actually read. ``phase``
    (a ``ClockLog.mark``) is told "prefill" at the start, "decode" when the decode phase
    starts and None at the end.
    """
    mark = phase or (lambda name: None)
    mark("prefill")
    start = time.perf_counter()
    streams = [engine.add_request(p, greedy(new_tokens)) for p in prompts]
    have_first: set[str] = set()
    decode_start: float | None = None
    decode_tokens = decode_calls = decode_steps_at_start = 0
    context_sum = rows_sum = 0  # over model steps of the decode phase
    prefill_steps: list[float] = []
    while not all(s.finished for s in streams):
        step_start = time.perf_counter()
        steps_before = engine._counters["steps"]
        running = list(engine.scheduler.running) if decode_start is not None else []
        # Step i of a burst of `ran` steps reads computed + 1 + i keys per row.
        contexts = sum(seq.num_computed_tokens + 1 for seq in running)
        outputs = engine.step()
        if decode_start is None:
            prefill_steps.append((time.perf_counter() - step_start) * 1e3)
        if decode_start is not None:
            decode_tokens += sum(len(o.token_ids) for o in outputs)
            decode_calls += 1
            ran = engine._counters["steps"] - steps_before
            context_sum += ran * contexts + len(running) * ran * (ran - 1) // 2
            rows_sum += ran * len(running)
            continue
        have_first.update(o.request_id for o in outputs if o.token_ids)
        if len(have_first) == len(streams):
            mark("decode")
            decode_start = time.perf_counter()
            decode_steps_at_start = engine._counters["steps"]
    end = time.perf_counter()
    mark(None)
    decode_tok_s = step_ms = mean_context = None
    model_steps = engine._counters["steps"] - decode_steps_at_start
    if decode_start is not None and decode_tokens and model_steps:
        decode_tok_s = decode_tokens / (end - decode_start)
        step_ms = (end - decode_start) / model_steps * 1e3
        mean_context = context_sum / rows_sum if rows_sum else None
    prefill_s = None if decode_start is None else decode_start - start
    return OursRun(
        end - start,
        decode_tok_s,
        [s.token_ids for s in streams],
        step_ms,
        prefill_s,
        tuple(prefill_steps),
        decode_model_steps=model_steps,
        decode_calls=decode_calls,
        decode_mean_context=mean_context,
    )


def time_to_first_token(engine: LLMEngine, prompt: list[int]) -> FirstToken:
    """Seconds from adding the request until a step hands out its first token."""
    start = time.perf_counter()
    stream = engine.add_request(prompt, greedy(1))
    while not any(o.request_id == stream.request_id and o.token_ids for o in engine.step()):
        pass
    elapsed = time.perf_counter() - start
    while not stream.finished:
        engine.step()
    usage = stream.usage
    return FirstToken(elapsed, usage.cached_tokens if usage else 0)


def measure_ttft(engine: LLMEngine, config: BenchConfig) -> TTFTResult:
    """Median cold and cached TTFT over fresh prompts (each one sent twice)."""
    cold: list[FirstToken] = []
    cached: list[FirstToken] = []
    for trial in range(config.ttft_trials):
        prompt = random_prompts(1, config.ttft_prompt_len, TTFT_SEED + trial)[0]
        cold.append(time_to_first_token(engine, prompt))
        cached.append(time_to_first_token(engine, prompt))
    cold_s = statistics.median(t.seconds for t in cold)
    cached_s = statistics.median(t.seconds for t in cached)
    return TTFTResult(
        prompt_len=config.ttft_prompt_len,
        trials=config.ttft_trials,
        cold_ms=cold_s * 1e3,
        cached_ms=cached_s * 1e3,
        speedup=cold_s / cached_s,
        cached_tokens=min(t.cached_tokens for t in cached),
    )


# ---- the run ------------------------------------------------------------------------------


def warm_up(engine: LLMEngine, hf_model: Any | None, prompt_len: int = 32) -> None:
    """One small generate each, so one-time costs (allocator, kernels) are paid here."""
    prompts = random_prompts(2, prompt_len, SEED - 1)
    engine.generate(prompts, greedy(4))
    if hf_model is not None:
        run_hf(hf_model, prompts, 4)


def measure_batch(
    engine: LLMEngine,
    hf_model: Any | None,
    batch: int,
    config: BenchConfig,
    also: Callable[[int, list[list[int]], OursRun, HFRun | None], None] | None = None,
    burst: int = 1,
    phase: Callable[[str | None], None] | None = None,
) -> ThroughputRow:
    """Ours, then HF on the same prompts, so both see the machine in the same state;
    then ``also`` (``--vllm``: vLLM) with the prompts and both runs. ``phase`` marks our
    runs' prefill and decode phases (``run_ours``).

    Each repeat uses fresh prompts: a repeated prompt would hit our prefix cache.
    """
    ours_runs: list[OursRun] = []
    hf_runs: list[HFRun] = []
    with_hf = hf_model is not None and (config.hf_batches is None or batch in config.hf_batches)
    for repeat in range(config.repeats):
        # Fresh prompts per repeat and per burst pass: a repeated prompt hits the prefix cache.
        seed = SEED + 1_000 * batch + repeat + (100_000 * burst if burst > 1 else 0)
        prompts = random_prompts(batch, config.prompt_len, seed)
        ours_runs.append(run_ours(engine, prompts, config.new_tokens, phase))
        if with_hf:
            hf_runs.append(run_hf(hf_model, prompts, config.new_tokens))
        if also is not None:
            also(batch, prompts, ours_runs[-1], hf_runs[-1] if with_hf else None)
    return summarize_batch(batch, config.new_tokens, ours_runs, hf_runs, burst)


def build_engine(config: BenchConfig) -> tuple[LLMEngine, Any | None]:
    """Our engine and (unless skipped) the HF model, on the benchmark's device and dtype."""
    lengths = [config.prompt_len + config.new_tokens, config.ttft_prompt_len + 1]
    lengths += [n + 1 for n in config.prefill_lens]
    engine_config = EngineConfig(
        device=config.device,
        dtype=config.dtype,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_batched_tokens,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=max(lengths) if config.random_model else None,
        decode_burst=max(config.decode_bursts),
        async_scheduling={"auto": None, "on": True, "off": False}[config.async_scheduling],
        cuda_fast_paths=config.cuda_fast_paths,
    )
    device = engine_config.torch_device()
    dtype = engine_config.torch_dtype(device)
    if config.random_model is None:
        engine = LLMEngine(engine_config)
        folder = resolve_model(None).folder
        return engine, None if config.skip_hf else load_hf_model(folder, dtype, config.device)
    from transformers import AutoTokenizer

    hf_model = engine_cuda.build_random_llama(config.random_model, dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or resolve_model(None).folder)
    parts = build_engine_parts_from_hf(engine_config, hf_model, tokenizer)
    return LLMEngine(engine_config, parts), None if config.skip_hf else hf_model


def engine_shape(engine: LLMEngine) -> DecodeShape:
    """The engine's model shape and dtype width, for the floors and the prefill FLOPs."""
    dtype_bytes = torch.empty((), dtype=engine.parts.runner.spec.dtype).element_size()  # type: ignore[attr-defined]
    return DecodeShape.of(engine.parts.model_config, dtype_bytes)


def add_floors(
    rows: list[ThroughputRow],
    engine: LLMEngine,
    config: BenchConfig,
    bandwidth: float,
    matmul_rate: float,
) -> list[ThroughputRow]:
    """Each row with the memory floor and the roofline of its decode steps, at the mean
    context its steps read (``floors.py``)."""
    shape = engine_shape(engine)
    out = []
    for row in rows:
        context = row.decode_mean_context or config.prompt_len + config.new_tokens / 2
        floors = decode_floors(shape, row.batch, context, bandwidth, matmul_rate)
        floor_ms, roof_ms = floors.memory_floor_s * 1e3, floors.roofline_s * 1e3
        step = row.decode_step_ms
        out.append(
            replace(
                row,
                floor_step_ms=floor_ms,
                floor_fraction=floor_ms / step if step else None,
                roofline_step_ms=roof_ms,
                roofline_fraction=roof_ms / step if step else None,
                roofline_per_op_ms={k: v * 1e3 for k, v in floors.per_op_s.items()},
            )
        )
    return out


def mark_run_phase(clock_log: ClockLog, batch: str, name: str | None) -> None:
    """Marks "batch N prefill" / "batch N decode" (``run_ours``'s phases); None ends them."""
    clock_log.mark(None if name is None else f"{batch} {name}")


def measure_all(
    config: BenchConfig,
    facts: dict[str, Any],
    extra: dict[str, Any],
    clock_log: ClockLog,
    started: float,
) -> tuple[LLMEngine, list[ThroughputRow], engine_vllm.VLLMSide | None]:
    """The machine's rates (GPU), the engine at each batch and burst (and HF, vLLM), and
    the prefill rates (GPU); each phase marked on ``clock_log``."""
    on_gpu = config.device.startswith("cuda")
    clock_log.mark(RATES_PHASE)
    if on_gpu:
        device = torch.device(config.device)
        engine_cuda.log_triton_compiles(time.perf_counter())
        facts.update(engine_cuda.gpu_facts(device))
        extra["copy_bandwidth_gb_s"] = engine_cuda.copy_bandwidth(device) / 1e9
        extra["bf16_matmul_tflop_s"] = engine_cuda.matmul_rate(device) / 1e12
    clock_log.mark("engine start-up, warm-up")
    engine, hf_model = build_engine(config)
    plan = engine.parts.plan
    extra["kv_cache"] = {"blocks": plan.num_blocks, "gib": plan.gib, "source": plan.budget_source}
    warm_up(engine, hf_model, config.prompt_len if on_gpu else 32)
    vllm = engine_vllm.VLLMSide(config) if config.vllm else None
    rows = []
    for burst in config.decode_bursts:
        engine.decode_burst = burst
        for batch in config.batches:
            print(
                f"[{time.perf_counter() - started:8.2f}s] batch {batch} burst {burst}", flush=True
            )
            with_hf = hf_model if burst == config.decode_bursts[0] else None
            phase = partial(mark_run_phase, clock_log, batch_phase(batch, burst))
            rows.append(
                measure_batch(engine, with_hf, batch, config, also=vllm, burst=burst, phase=phase)
            )
    engine.decode_burst = config.decode_bursts[0]
    if on_gpu:
        bandwidth = extra["copy_bandwidth_gb_s"] * 1e9
        rows = add_floors(rows, engine, config, bandwidth, extra["bf16_matmul_tflop_s"] * 1e12)
        clock_log.mark("prefill " + ",".join(map(str, config.prefill_lens)))
        extra["prefill"] = engine_cuda.measure_prefill(
            engine,
            config.prefill_lens,
            lambda n, i: random_prompts(1, n, TTFT_SEED + 7 * n + i)[0],
            greedy(1),
        )
        matmul_rate = extra["bf16_matmul_tflop_s"] * 1e12
        engine_cuda.add_matmul_shares(extra["prefill"], engine_shape(engine), matmul_rate)
    return engine, rows, vllm


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config, out_path = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    facts = machine_facts()
    on_gpu = config.device.startswith("cuda")
    extra: dict[str, Any] = {}
    clock_log = ClockLog(out_path.with_suffix(".smi.csv"))  # GPU clocks per phase
    with clock_log:
        engine, rows, vllm = measure_all(config, facts, extra, clock_log, started)
    clocks = clock_log.summary()
    if any(row["samples"] for row in clocks):
        extra["gpu_clocks"] = clocks
    ttft = measure_ttft(engine, config)
    goals = evaluate_goals(rows, ttft, config.device)
    print()
    print(format_table(rows, ttft, goals, config))
    if on_gpu:
        print_gpu_extras(extra)
    if "gpu_clocks" in extra:
        print(clock_table(extra["gpu_clocks"]))
    if on_gpu:
        extra["skinny_matmul"] = skinny_matmul.choices()  # cuBLAS or Triton, per shape
        extra["gated_gemm"] = gated_gemm.choices()  # gate|up + SiLU·mul, per row bucket
        print("gated gemm:", extra["gated_gemm"])
        print("skinny, 17-64 rows:", {k: v for k, v in extra["skinny_matmul"].items()
                                      if 16 < int(k.split("x")[0]) <= 64})  # fmt: skip
    if vllm is not None:
        extra["vllm"] = vllm.report(rows)
        print("\n" + engine_vllm.format_vllm_table(vllm.rows(rows), vllm.start_s))
        vllm.close()
    report = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**facts, "load_average_end": list(os.getloadavg())},
        "model": config.random_model or engine.parts.model_origin,
        "config": asdict(config),
        "throughput": [asdict(row) for row in rows],
        "ttft": asdict(ttft),
        "goals": goals,
        **extra,
    }
    write_json(out_path, report)
    if "gpu_clocks" in extra and config.random_model:
        print("\n" + clock_report(report))  # the roofline at each phase's SM clock
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
