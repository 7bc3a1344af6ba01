"""Llama-3.1-8B's gate|up projection + SiLU·mul at many rows: cuBLAS then ``silu_and_mul``
against the fused Triton GEMM (``actors.engine.cuda.gated_gemm``), tile by tile.

Run on a GPU from the repository root:
    python3 -m bench.engine.gated_gemm --rows 256,2048,8192 --out bench/results/X.json
Per row count it times the unfused pair (``F.linear`` with the gate|up weight, then
``fused_ops.silu_and_mul``) and each tile, sustained: rounds of back-to-back runs (at
least ~50 ms each, as a prefill's 32 layers run them), the candidates interleaved round
by round so clock and power drift fall on all alike; the median round per candidate.
Prints µs, TFLOP/s and the ratio to the unfused pair, and checks each tile against the
unfused output (the largest difference over the largest value, and the share of equal
elements: the GEMMs sum in different orders, so bf16 results may differ in the last bit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.engine.args import batch_sizes
from dynask.actors.engine.cuda import fused_ops, gated_gemm
from dynask.actors.engine.cuda.gated_gemm import GatedTile

HIDDEN, INTERMEDIATE = 4096, 14336
# The tiles, persistent over one program per SM or (``persistent=False``) one program per
# tile. (Loads through pointers instead of tensor descriptors, a kernel since removed, ran
# 1.25-1.28x the unfused pair's time at 8,192 rows: engine-h200-gated-sweep-pointers.log.)
VARIANTS = (
    GatedTile(128, 128, 64, 8, 3),
    GatedTile(128, 128, 64, 8, 4),
    GatedTile(128, 64, 64, 4, 4),
    GatedTile(128, 64, 64, 8, 4),
    GatedTile(64, 128, 64, 4, 4),
    GatedTile(128, 128, 64, 8, 4, group_m=16),
    GatedTile(128, 128, 64, 8, 4, persistent=False),
    GatedTile(128, 64, 64, 8, 4, persistent=False),
)
ROUNDS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=batch_sizes, default=(256, 2048, 8192))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    weight = torch.randn(2 * INTERMEDIATE, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02
    table = []
    for rows in args.rows:
        x = torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16)
        table.append(measure(x, weight))
        best = min(table[-1]["tiles"], key=lambda t: t["us"], default=None)
        print(
            f"rows {rows:5}: unfused {table[-1]['unfused_us']:9.1f} µs "
            f"({table[-1]['unfused_tflops']:.0f} TFLOP/s); best tile {best and best['tile']} "
            f"{best and best['us']:.1f} µs ({best and best['ratio']:.3f}x of unfused)",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "rows": table}, indent=1))  # fmt: skip


def measure(x: torch.Tensor, weight: torch.Tensor) -> dict[str, Any]:
    rows = x.shape[0]
    flops = 2 * rows * HIDDEN * 2 * INTERMEDIATE
    expected = fused_ops.silu_and_mul(F.linear(x, weight))
    runs: dict[str, Any] = {"unfused": lambda: fused_ops.silu_and_mul(F.linear(x, weight))}
    checks = {}
    for tile in VARIANTS:
        name = f"tma {tile}"
        run = partial(gated_gemm.launch, x, weight, tile)
        try:
            got = run()
            torch.cuda.synchronize()
        except Exception as error:  # resources this GPU lacks: report and skip
            print(f"  {name}: {type(error).__name__}: {str(error)[:160]}")
            continue
        scale = expected.float().abs().max().item()
        checks[name] = {
            "max_rel_diff": (got.float() - expected.float()).abs().max().item() / scale,
            "equal_share": (got == expected).float().mean().item(),
        }
        runs[name] = run
    runs["cublas gate|up alone"] = lambda: F.linear(x, weight)  # what SiLU·mul adds to
    checks["cublas gate|up alone"] = {"max_rel_diff": float("nan"), "equal_share": float("nan")}
    repeat = max(3, int(50e-3 / max(_once(runs["unfused"]), 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            samples[name].append(_round(run, repeat))
    unfused = statistics.median(samples.pop("unfused"))
    tiles = []
    for name, times in samples.items():
        took = statistics.median(times)
        tiles.append({"tile": name, "us": took * 1e6, "tflops": flops / took / 1e12,
                      "ratio": took / unfused, **checks[name]})  # fmt: skip
        print(f"  rows {rows:5} {name:34} {took * 1e6:9.1f} µs {flops / took / 1e12:5.0f} "
              f"TFLOP/s {took / unfused:.3f}x  rel diff {checks[name]['max_rel_diff']:.1e} "
              f"equal {checks[name]['equal_share']:.3f}")  # fmt: skip
    return {"rows": rows, "unfused_us": unfused * 1e6, "unfused_tflops": flops / unfused / 1e12,
            "repeat": repeat, "tiles": tiles}  # fmt: skip


def _once(run: Any) -> float:
    run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _round(run: Any, repeat: int) -> float:
    """Seconds per run over ``repeat`` back-to-back runs."""
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeat):
        run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end) / 1e3 / repeat)


if __name__ == "__main__":
    main()
