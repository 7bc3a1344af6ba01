"""The decode projections of Llama-3.1-8B at small batch: cuBLAS vs the Triton skinny matmul.

Run on a GPU from the repository root (bench/h200_decodefuse.sh does):
    python3 -m bench.engine.skinny_matmul --rows 1,16,64 --out bench/results/X.json
Per projection (q|k|v, o, down with SiLU·mul in front, q|k|v and gate|up with add +
RMSNorm in front) and row count it prints the median time of cuBLAS (``F.linear`` after
the unfused ``silu_and_mul`` / ``add_rms_norm`` kernel) and of each candidate tile, in µs
and in TB/s of weight bytes, with what the engine would pick. ``--sweep`` times a wider
grid of tiles (block sizes, warps, stages, split-K) than the engine's candidates, to choose
those, and checks each tile's output against ``F.linear`` (and split-K's for repeatability).
Weights are random bf16; the timing is the engine's own (``kernel_chooser._time``: back to
back, the weight read from HBM each run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.engine.args import batch_sizes
from dynask.actors.engine.cuda import fused_ops, kernel_chooser, skinny_matmul
from dynask.actors.engine.cuda.skinny_matmul import Tile

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
    parser.add_argument("--sweep", action="store_true", help="a wide grid of tiles")
    parser.add_argument("--ops", default=",".join(SHAPES), help="of " + ", ".join(SHAPES))
    args = parser.parse_args()
    device = torch.device("cuda")
    table = []
    for name in args.ops.split(","):
        n, k, prologue = SHAPES[name]
        layer = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
        for rows in args.rows:
            tiles = sweep(rows) if args.sweep else list(skinny_matmul.candidates(rows))
            row = _measure(name, layer.weight, rows, prologue, tiles)
            table.append(row)
            print(
                f"{name:5} rows {rows:3}: cuBLAS {row['cublas_us']:6.1f} µs "
                f"({row['cublas_tb_s']:.2f} TB/s), Triton best {row['best_triton_us']:6.1f} µs "
                f"({row['triton_tb_s']:.2f} TB/s) -> {row['picked']}; "
                + ", ".join(
                    f"{t}: {v:.1f}" for t, v in sorted(row["tiles"].items(), key=lambda i: i[1])[:6]
                )
            )
            for tile, problem in row["errors"].items():
                print(f"  {tile}: {problem}")
            _write(args.out, table)  # after every row: a timed-out sweep keeps what it had


def _write(out: Path, table: list[dict[str, Any]]) -> None:
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": table,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


def sweep(rows: int) -> list[Tile]:
    """The grid ``--sweep`` times: one row (the GEMV kernel) or 2..64 rows (``tl.dot``)."""
    if rows == 1:
        shapes = [(4, 1024), (8, 512), (8, 1024), (16, 256), (16, 512), (32, 256)]
        return [
            Tile(bn, bk, warps, stages, split)
            for bn, bk in shapes
            for warps, stages in ((4, 3), (4, 4), (8, 3))
            for split in (1, 2)
        ]
    shapes = [(32, 64), (32, 128), (64, 64), (64, 128), (128, 64)]
    return [
        Tile(bn, bk, warps, stages, split)
        for bn, bk in shapes
        for warps, stages in ((4, 4), (8, 4), (4, 6))
        for split in (1, 2, 4)
    ]


def _measure(
    name: str, weight: torch.Tensor, rows: int, prologue: str, candidates: list[Tile]
) -> dict[str, Any]:
    n, k = weight.shape
    device = weight.device
    x = torch.randn((rows, 2 * k if prologue == "gated" else k), device=device, dtype=weight.dtype)
    residual, norm_weight = torch.randn_like(x), torch.randn(k, device=device, dtype=x.dtype)
    norm = skinny_matmul.Norm(norm_weight, 1e-5, residual, torch.empty_like(x))

    def inputs() -> torch.Tensor:  # the unfused small kernel in front of the matmul
        if prologue == "gated":
            return fused_ops.silu_and_mul(x)
        if prologue == "norm":
            return fused_ops.add_rms_norm(x, residual, norm_weight, 1e-5)[0]
        return x

    weights = kernel_chooser.cold_copies(weight)
    cublas = kernel_chooser._time(lambda w: F.linear(inputs(), w), weights)
    expected = F.linear(inputs().float(), weight.float())
    tiles: dict[str, float] = {}
    errors: dict[str, str] = {}
    for tile in candidates:
        if not tile.fits(n, k):
            continue

        def fused(w: torch.Tensor, tile: Tile = tile) -> torch.Tensor:
            return skinny_matmul.launch(
                x, w, None, tile, prologue == "gated", norm if prologue == "norm" else None
            )

        try:
            tiles[str(tile)] = kernel_chooser._time(fused, weights) * 1e3
            if problem := _wrong(fused(weight), expected, [fused(weight) for _ in range(20)]):
                errors[str(tile)] = problem
        except Exception as error:  # a tile this GPU cannot run: named, not fatal
            errors[str(tile)] = f"failed: {error}"[:200]
    del weights
    tiles = tiles or {"none ran": float("inf")}
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
        "best_tile": min(tiles, key=tiles.__getitem__),
        "errors": errors,
    }


def _wrong(got: torch.Tensor, expected: torch.Tensor, repeats: list[torch.Tensor]) -> str:
    """What is wrong with a tile's output ('' when nothing): far from the float32 product,
    or not the same bits every run (split-K sums its partials in a fixed order)."""
    scale = expected.abs().max().item()
    error = (got.float() - expected).abs().max().item()
    if error > 2e-2 * scale:
        return f"max error {error:.3g} of {scale:.3g}"
    if not all(torch.equal(r, got) for r in repeats):
        return "not repeatable"
    return ""


if __name__ == "__main__":
    main()
