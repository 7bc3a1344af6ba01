"""Where prefill and the cached-prefix TTFT spend their time on a GPU (issue 19; a
diagnostic, not a benchmark of record: ``bench.engine.throughput`` is).

1. Fresh-chunk attention (what a lone prompt chunk runs): SDPA with flash attention only
   against cuDNN first, on q/k/v views of one fused qkv output as the engine passes them
   (Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128, bf16, causal), TFLOP/s and the
   largest difference between the two outputs.
2. The paged prefill kernel on the cached-prompt shape (16 new tokens after 4,080 cached,
   the recomputed last block of a 4,096-token prompt) with one program per tile and with
   the key splits ``prefill_splits`` picks; and on a chunked-prefill shape (2,048 new
   after 6,144 cached) with the tile sizes of today and two others.
3. The random Llama-3.1-8B-shaped engine, fast paths on (``--cuda-fast-paths``): cold
   and cached TTFT of a 4,096-token prompt, the cached one replayed from the short
   prefill graph and eagerly (the graph set aside), the host time spent launching the
   eager step's forward pass, and the eager cached step and an 8,192-token prefill once
   more under the torch profiler: wall time, the GPU's busy time (the sum of its
   kernels) and the slowest kernels.

Run from the repository root on the GPU machine (see ``bench/h200.sh`` for the set-up)::

    python3 -m bench.engine.prefill_probe --tokenizer .devcarry/tokenizer --out PATH.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.engine import cuda as engine_cuda
from bench.engine import throughput as bench
from bench.engine.args import parse_args
from dynask.actors.engine.cuda import triton_attention

HEADS, KV_HEADS, DIM = 32, 8, 128


def gpu_ms(fn: Callable[[], Any], reps: int = 10) -> float:
    """Median milliseconds of ``fn`` on the GPU (CUDA events), after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def fresh_chunk(tokens: int) -> dict[str, Any]:
    qkv = torch.randn((tokens, (HEADS + 2 * KV_HEADS) * DIM), device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)
    q = q.view(tokens, HEADS, DIM).transpose(0, 1).unsqueeze(0)
    k = k.view(tokens, KV_HEADS, DIM).transpose(0, 1).unsqueeze(0)
    v = v.view(tokens, KV_HEADS, DIM).transpose(0, 1).unsqueeze(0)
    flops = 4 * HEADS * DIM * tokens * (tokens + 1) / 2

    def run(backends: list[SDPBackend]) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            context: AbstractContextManager[None] = sdpa_kernel(backends)
            with context:
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=DIM**-0.5, enable_gqa=True
                )

        return call

    flash = run([SDPBackend.FLASH_ATTENTION])
    cudnn = run([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION])
    result: dict[str, Any] = {"tokens": tokens}
    for name, fn in (("flash", flash), ("cudnn_first", cudnn)):
        ms = gpu_ms(fn)
        result[f"{name}_ms"] = ms
        result[f"{name}_tflop_s"] = flops / ms / 1e9
    try:
        only = run([SDPBackend.CUDNN_ATTENTION])()
        result["cudnn_max_abs_diff_vs_flash"] = float((only.float() - flash().float()).abs().max())
    except RuntimeError as error:  # cuDNN refused the shape: cudnn_first ran flash
        result["cudnn_error"] = str(error)[:200]
    return result


def paged(cached: int, new: int, splits: int | None, block_m: int, block_n: int) -> dict[str, Any]:
    block_size = 16
    blocks = -(-(cached + new) // block_size)
    generator = torch.Generator(device="cuda").manual_seed(cached + new)
    shape = (blocks + 8, block_size, KV_HEADS, DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    table = torch.randperm(blocks + 8, device="cuda", generator=generator)[:blocks]
    q = torch.randn((new, HEADS, DIM), device="cuda", dtype=torch.bfloat16, generator=generator)
    out = torch.empty_like(q)
    saved = triton_attention.PREFILL_BLOCK_M, triton_attention.PREFILL_BLOCK_N
    triton_attention.PREFILL_BLOCK_M, triton_attention.PREFILL_BLOCK_N = block_m, block_n
    try:
        spans = [(0, new, cached)]
        group = HEADS // KV_HEADS
        tiles = triton_attention.prefill_tiles(spans, group, q.device)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        count = triton_attention.num_prefill_tiles(spans, group)
        chosen = splits or triton_attention.prefill_splits(count, KV_HEADS, sms, cached + new)
        tables = table.view(1, -1).to(torch.int32)
        if chosen == 1:  # the kernel of before

            def launch() -> None:
                triton_attention.paged_prefill(
                    q, k_cache, v_cache, out, tables, tiles, DIM**-0.5, None
                )
        else:  # the fast paths' split kernel and its merge

            def launch() -> None:
                triton_attention.paged_prefill_split(
                    q, k_cache, v_cache, out, tables, tiles, DIM**-0.5, None, chosen
                )

        ms = gpu_ms(launch)
    finally:
        triton_attention.PREFILL_BLOCK_M, triton_attention.PREFILL_BLOCK_N = saved
    flops = 4 * HEADS * DIM * new * (cached + (new + 1) / 2)
    return {
        "cached": cached,
        "new": new,
        "splits": chosen,
        "block_m": block_m,
        "block_n": block_n,
        "ms": ms,
        "ms_per_step_32_layers": 32 * ms,
        "tflop_s": flops / ms / 1e9,
    }


def profiled(label: str, fn: Callable[[], Any], out_dir: Path) -> dict[str, Any]:
    """Wall time of ``fn`` alone, then under the profiler: GPU busy time, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    kernels = [e for e in averages if str(e.device_type).endswith("CUDA")]
    busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    launches = sum(e.count for e in kernels)
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:8]
    (out_dir / f"profile-{label}.txt").write_text(
        averages.table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
    )
    return {
        "wall_ms": wall_ms,
        "gpu_busy_ms_profiled": busy_ms,
        "kernel_launches": launches,
        "top_kernels_ms": {e.key[:70]: e.self_device_time_total / 1e3 for e in top},
    }


def enqueue_ms(engine: Any, fn: Callable[[], Any]) -> list[float]:
    """Host milliseconds spent inside the model's forward calls of ``fn`` (no sync: the
    time to launch its kernels). Near the step's wall time: the step is host-bound."""
    model = engine.parts.runner.model
    original = model.forward
    spent: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(*args, **kwargs)
        spent.append((time.perf_counter() - start) * 1e3)
        return result

    model.forward = timed
    try:
        fn()
    finally:
        del model.forward
    return spent


def engine_part(tokenizer: str, out_dir: Path) -> dict[str, Any]:
    config, _ = parse_args(
        [
            "--device", "cuda", "--random-model", "llama-8b", "--tokenizer", tokenizer,
            "--batches", "1", "--max-batched-tokens", "8192", "--gpu-memory-utilization", "0.55",
            "--ttft-prompt-len", "4096", "--prefill-lens", "8192", "--skip-hf",
            "--max-num-seqs", "4", "--cuda-fast-paths",
        ]
    )  # fmt: skip
    engine, _ = bench.build_engine(config)
    bench.warm_up(engine, None, 512)
    prompt = bench.random_prompts(1, 4096, 4242)[0]
    result: dict[str, Any] = {}

    def ttft() -> float:
        return bench.time_to_first_token(engine, prompt).seconds * 1e3

    runner: Any = engine.parts.runner  # a ModelRunner on CUDA
    result["cold_ms"] = ttft()
    result["cached_ms_graph"] = [ttft() for _ in range(3)]
    short, runner.short_prefill = runner.short_prefill, None  # the eager step, as before
    result["cached_ms_eager"] = [ttft() for _ in range(3)]
    result["cached_eager_forward_enqueue_ms"] = enqueue_ms(engine, ttft)
    try:
        result["cached_eager_profile"] = profiled("cached-ttft-eager", ttft, out_dir)
        runner.short_prefill = short
        long_prompts = iter(bench.random_prompts(4, 8192, 4343))
        engine.generate([next(long_prompts)], bench.greedy(1))  # warm-up of the length
        result["prefill_8192_profile"] = profiled(
            "prefill-8192", lambda: engine.generate([next(long_prompts)], bench.greedy(1)), out_dir
        )
    except Exception as error:  # a diagnostic: keep what was measured
        result["profile_error"] = repr(error)[:300]
    runner.short_prefill = short
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args()
    facts = engine_cuda.gpu_facts(torch.device("cuda"))
    report: dict[str, Any] = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**facts, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()},
    }
    report["fresh_chunk"] = [fresh_chunk(n) for n in (1024, 4096, 8192)]
    for row in report["fresh_chunk"]:
        print(json.dumps(row))
    report["paged_prefill"] = [
        paged(4080, 16, 1, 64, 64),
        paged(4080, 16, None, 64, 64),
        paged(6144, 2048, 1, 64, 64),
        paged(6144, 2048, 1, 128, 64),
        paged(6144, 2048, 1, 64, 32),
    ]
    for row in report["paged_prefill"]:
        print(json.dumps(row))
    if not args.skip_engine:
        report["engine"] = engine_part(args.tokenizer, args.out.parent)
        print(json.dumps(report["engine"], indent=1))
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
