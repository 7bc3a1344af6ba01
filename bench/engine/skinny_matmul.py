"""The decode projections of Llama-3.1-8B at small batch: cuBLAS vs the Triton skinny matmul.

Run on a GPU from the repository root (bench/h200_decodefuse.sh does):
    python3 -m bench.engine.skinny_matmul --rows 1,16,64 --out bench/results/X.json
Per projection (q|k|v, o, down with SiLU·mul in front, q|k|v and gate|up with add +
RMSNorm in front) and row count it prints the median cold-L2 time of cuBLAS (``F.linear``
after the unfused ``silu_and_mul`` / ``add_rms_norm`` kernel) and of each candidate tile,
in µs and in TB/s of weight bytes, with what the engine would pick.
Weights are random bf16; the timing is the engine's own (``skinny_matmul._time``).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.engine.args import batch_sizes
from dynask.actors.engine.cuda import fused_ops, skinny_matmul

# name: (N, K, prologue); "norm": add + RMSNorm in front (the unfused side: add_rms_norm)
SHAPES = {
    "qkv": (6144, 4096, "plain"),
    "o": (4096, 4096, "plain"),
    "down": (4096, 14336, "gated"),
    "norm+qkv": (6144, 4096, "norm"),
    "norm+gate_up": (28672, 4096, "norm"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=batch_sizes, default=(1, 16, 64))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    table = []
    for name, (n, k, prologue) in SHAPES.items():
        layer = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
        for rows in args.rows:
            row = _measure(name, layer.weight, rows, prologue)
            table.append(row)
            print(
                f"{name:5} rows {rows:3}: cuBLAS {row['cublas_us']:6.1f} µs "
                f"({row['cublas_tb_s']:.2f} TB/s), Triton best {row['best_triton_us']:6.1f} µs "
                f"({row['triton_tb_s']:.2f} TB/s) -> {row['picked']}; "
                + ", ".join(f"{t}: {v:.1f}" for t, v in row["tiles"].items())
            )
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


def _measure(name: str, weight: torch.Tensor, rows: int, prologue: str) -> dict[str, Any]:
    n, k = weight.shape
    device = weight.device
    x = torch.randn((rows, 2 * k if prologue == "gated" else k), device=device, dtype=weight.dtype)
    residual, norm_weight = torch.randn_like(x), torch.randn(k, device=device, dtype=x.dtype)
    norm = skinny_matmul.Norm(norm_weight, 1e-5, residual, torch.empty_like(x))
    if prologue == "gated":
        cublas = skinny_matmul._time(lambda: F.linear(fused_ops.silu_and_mul(x), weight), device)
    elif prologue == "norm":
        cublas = skinny_matmul._time(
            lambda: F.linear(fused_ops.add_rms_norm(x, residual, norm_weight, 1e-5)[0], weight),
            device,
        )
    else:
        cublas = skinny_matmul._time(lambda: F.linear(x, weight), device)
    tiles: dict[str, float] = {}
    for tile in skinny_matmul.candidates(rows):
        if tile.fits(n, k):
            run = partial(
                skinny_matmul.launch, x, weight, None, tile, prologue == "gated",
                norm if prologue == "norm" else None,
            )  # fmt: skip
            tiles[str(tile)] = skinny_matmul._time(run, device) * 1e3
    best = min(tiles.values())
    weight_bytes = n * k * weight.element_size()
    return {
        "op": name,
        "rows": rows,
        "cublas_us": cublas * 1e3,
        "tiles": tiles,
        "best_triton_us": best,
        "cublas_tb_s": weight_bytes / (cublas * 1e-3) / 1e12,
        "triton_tb_s": weight_bytes / (best * 1e-6) / 1e12,
        "picked": "triton" if best * 1e-3 < skinny_matmul.MARGIN * cublas else "cublas",
    }


if __name__ == "__main__":
    main()
