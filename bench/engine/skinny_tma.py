"""Llama-3.1-8B's decode projections at 64 rows (batch 64): cuBLAS against skinny GEMMs
that read the weight through tensor descriptors (TMA), split over K or not.

At batch 64 an H200 profile (2026-12-04) had cuBLAS reading the q|k|v and o weights at
~70% of the copy bandwidth (16.7 and 11.6 µs against 12 and 8), and the engine's Triton
skinny kernels (pointer loads, ``skinny_matmul``) slower still. This sweep asks whether
TMA loads change that, and which tiles the engine should offer:

* o, q|k|v, down: ``F.linear`` against the TMA skinny GEMM (``actors.engine.cuda.
  skinny_tma``, whose candidates the engine's chooser offers) per tile (BLOCK_N,
  BLOCK_K, split-K or stream-K, stages), and against the engine's pointer-load 64-row
  tiles;
* gate|up: ``F.linear`` + ``silu_and_mul`` against the fused gate|up GEMM
  (``gated_gemm.launch``) with 64-row tiles, one program per tile or persistent.

Each is timed as the engine's start-up chooser times it (``kernel_chooser._times``: runs
back to back, cycling through copies of the weight that fill twice the L2, candidates
interleaved round by round) and checked against ``F.linear`` (largest difference over the
largest value). Run on a GPU from the repository root:
    python3 -m bench.engine.skinny_tma --rows 64 --out bench/results/X.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.engine import cuda as engine_cuda
from bench.engine.args import batch_sizes
from dynask.actors.engine.cuda import fused_ops, gated_gemm, kernel_chooser, skinny_matmul
from dynask.actors.engine.cuda.gated_gemm import GatedTile
from dynask.actors.engine.cuda.skinny_tma import TmaTile

HIDDEN, INTERMEDIATE, QKV = 4096, 14336, 6144


def launch(x: torch.Tensor, weight: torch.Tensor, tile: TmaTile) -> torch.Tensor:
    """``x @ weight^T`` through the engine's TMA path (``skinny_matmul.launch``)."""
    return skinny_matmul.launch(x, weight, None, tile)


def tma_tiles(n: int, k: int) -> list[TmaTile]:
    """The plain candidates for an ``n x k`` weight (96..1,056 programs, >= 2 K blocks
    each) and the stream-K ones (1 or 2 programs per SM)."""
    tiles = []
    for block_n in (32, 64, 128):
        for block_k in (64, 128):
            for split in (1, 2, 4, 8):
                programs = n // block_n * split
                per_program = k // split
                if 96 <= programs <= 1056 and per_program >= 2 * block_k:
                    tiles.append(TmaTile(block_n, block_k, split, 4, 6 if block_k == 64 else 4))
            for stream, stages in ((1, 4), (1, 6), (2, 3), (2, 4)):
                if block_n * block_k * stages <= 64 * 128 * 4:  # two tiles' stages in shared memory
                    tiles.append(TmaTile(block_n, block_k, 1, 4, stages, stream_k=stream))
    return [t for t in tiles if t.fits(n, k)]


GATED_TILES = (
    GatedTile(64, 32, 64, 4, 4, persistent=False),
    GatedTile(64, 32, 128, 4, 4, persistent=False),
    GatedTile(64, 64, 64, 4, 4, persistent=False),
    GatedTile(64, 64, 128, 4, 3, persistent=False),
    GatedTile(64, 32, 128, 4, 4),
    GatedTile(64, 64, 64, 4, 4),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=batch_sizes, default=(64,))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    bandwidth = engine_cuda.copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    results = []
    for rows in args.rows:
        results.append(_plain(rows, "o", HIDDEN, HIDDEN, bandwidth))
        results.append(_plain(rows, "q|k|v", QKV, HIDDEN, bandwidth))
        results.append(_plain(rows, "down", HIDDEN, INTERMEDIATE, bandwidth))
        results.append(_gated(rows, bandwidth))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "copy_bandwidth_tb_s": bandwidth / 1e12,
                                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "results": results}, indent=1))  # fmt: skip


def _plain(rows: int, name: str, n: int, k: int, bandwidth: float) -> dict[str, Any]:
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    runs: dict[str, Callable[[torch.Tensor], object]] = {}
    for tile in tma_tiles(n, k):
        runs[str(tile)] = partial(_run_tma, x, tile)
    for s_tile in skinny_matmul.candidates(rows):
        if s_tile.fits(n, k):
            runs[f"engine {s_tile}"] = partial(_run_engine_tile, x, s_tile)
    return _measure(rows, name, weight, partial(F.linear, x), runs, bandwidth)


def _gated(rows: int, bandwidth: float) -> dict[str, Any]:
    weight = torch.randn(2 * INTERMEDIATE, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    runs: dict[str, Callable[[torch.Tensor], object]] = {}
    for tile in GATED_TILES:
        runs[f"gated {tile}"] = partial(_run_gated, x, tile)
    return _measure(rows, "gate|up+silu", weight, partial(_cublas_gated, x), runs, bandwidth)


def _run_tma(x: torch.Tensor, tile: TmaTile, weight: torch.Tensor) -> torch.Tensor:
    return launch(x, weight, tile)


def _run_engine_tile(x: torch.Tensor, tile: skinny_matmul.Tile, weight: torch.Tensor) -> object:
    return skinny_matmul.launch(x, weight, None, tile)


def _run_gated(x: torch.Tensor, tile: GatedTile, weight: torch.Tensor) -> object:
    return gated_gemm.launch(x, weight, tile)


def _cublas_gated(x: torch.Tensor, weight: torch.Tensor) -> object:
    return fused_ops.silu_and_mul(F.linear(x, weight))


def _measure(
    rows: int,
    name: str,
    weight: torch.Tensor,
    reference: Callable[[torch.Tensor], object],
    runs: dict[str, Callable[[torch.Tensor], object]],
    bandwidth: float,
) -> dict[str, Any]:
    expected = reference(weight)
    assert isinstance(expected, torch.Tensor)
    scale = expected.float().abs().max().item()
    runnable, diffs = {}, {}
    for label, run in runs.items():
        try:
            got = run(weight)
            torch.cuda.synchronize()
        except Exception as error:  # resources this GPU lacks: report and skip
            print(f"  {name} {label}: {type(error).__name__}: {str(error)[:120]}")
            continue
        assert isinstance(got, torch.Tensor)
        diffs[label] = (got.float() - expected.float()).abs().max().item() / scale
        runnable[label] = run
    copies = kernel_chooser.cold_copies(weight)
    took = kernel_chooser._times([reference, *runnable.values()], copies)
    floor_us = weight.numel() * weight.element_size() / bandwidth * 1e6
    rows_out = []
    print(f"rows {rows} {name}: cublas {took[0] * 1e3:.1f} µs (weights at the copy rate: "
          f"{floor_us:.1f} µs)")  # fmt: skip
    for label, ms in sorted(zip(runnable, took[1:], strict=True), key=lambda p: p[1])[:8]:
        print(f"  {label:40} {ms * 1e3:7.1f} µs {ms / took[0]:.3f}x  rel diff {diffs[label]:.1e}")
    for label, ms in zip(runnable, took[1:], strict=True):
        rows_out.append({"tile": label, "us": ms * 1e3, "ratio": ms / took[0],
                         "max_rel_diff": diffs[label]})  # fmt: skip
    return {"rows": rows, "projection": name, "cublas_us": took[0] * 1e3,
            "floor_us_at_copy_rate": floor_us, "tiles": rows_out}  # fmt: skip


if __name__ == "__main__":
    main()
