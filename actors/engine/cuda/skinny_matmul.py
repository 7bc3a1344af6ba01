"""The decode step's projections at small batch: cuBLAS or a Triton skinny matmul, timed.

At batch 1 an H200 profile showed cuBLAS's GEMVs for q|k|v (6144 x 4096) and o
(4096 x 4096) at ~3.05 TB/s, where gate|up reaches 4.1 TB/s; o and down each add a
split-K reduce kernel, and every layer runs two add + RMSNorm kernels and a SiLU·mul
kernel besides (~2 µs each at batch 1, launch-bound). A decode step at small batch is
bound by reading the weights, so:

* ``triton_gemv``'s kernels give each program ``BLOCK_N`` output columns over the whole
  K, or over 1/``split_k`` of it, the last program of a column tile to finish summing the
  partials (no reduce kernel either way; split-K gives skinny shapes with few column
  tiles, o and q|k|v at 64 rows, more programs than SMs). One row (batch 1,
  ``gemv_kernel``) multiplies into a float32 tile summed once after the K loop; 2..64
  rows (``skinny_matmul_kernel``) use ``tl.dot`` with the rows padded to 16 or 64.
* The small ops in front of a projection run inside it, rounded exactly as the unfused
  kernels round: ``norm_linear`` (add + RMSNorm, then q|k|v or gate|up; program 0 writes
  the new residual) and ``gated_linear`` (SiLU(gate)·up, then down).
* Which is faster depends on the shape, the row count and the GPU, and cannot be known
  without one: the first eager call of each (row bucket, shape, dtype, prologue) times the
  unfused ops (cuBLAS plus the small kernel) against the fused kernel on a few tiles and
  keeps the fastest; Triton only wins by a margin (3%). How it times, and which
  candidates it drops first (failing to run, or output not the unfused ops'), is
  ``kernel_chooser``'s. During CUDA-graph capture nothing is timed: an undecided shape
  takes the unfused ops (the runner's warm-up before each capture decides it first).
  The row buckets are the decode graphs' batch sizes (``row_bucket``: 1, 2, 4, then
  multiples of 8), so an eager step of any row count (a mixed step: a prompt's last
  chunk beside decodes) finds its choice made at start-up instead of timing ~10
  candidates, compiles included, inside a request's step once per row count.
* At 17..64 rows the candidates also include ``skinny_tma``'s GEMM (weights through
  tensor descriptors, no prologue inside: the small kernel runs first), for bias-free
  layers.
* On Hopper and later the kernels are launched with PDL (``pdl``): each starts during the
  tail of the kernel before it, having read its first weights, and the chooser keeps
  Triton on a tie (``PDL_MARGIN``), since timing one op back to back cannot see that.
* Only bf16/fp16 weights on CUDA, rows <= ``MAX_ROWS``: float32 (the HF-equality tests)
  and the CPU keep the plain torch ops, bit for bit as before.
* On by default on CUDA since 2026-12-01 (verified on an H200): the model calls these
  functions only after ``CausalLM.use_skinny_projections``, which the CUDA runner calls
  under ``EngineConfig.cuda_fast_paths`` (``--no-cuda-fast-paths`` turns it off); off, and
  on a CPU, the model runs the ops of before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dynask.actors.engine.cuda import fused_ops, kernel_chooser, pdl, skinny_tma
from dynask.actors.engine.cuda.skinny_tma import TmaTile

log = logging.getLogger(__name__)

MAX_ROWS = 64
MARGIN = 0.97  # Triton is kept only when it takes at most this share of cuBLAS's time
# With PDL (see pdl) a Triton kernel also lets the kernel after it start during its tail,
# which timing one op back to back cannot see: there Triton is kept unless cuBLAS is
# clearly faster. On the H200 (2026-12-04) add+RMSNorm+gate|up at batch 1 timed even
# (Triton 58.9 µs, cuBLAS 58.7) and the step's graph replay took 4.04 ms with it in
# Triton, 4.08-4.19 ms in cuBLAS.
PDL_MARGIN = 1.03
_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Tile:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # programs per n-tile, each over K / split_k (see triton_gemv)

    def __str__(self) -> str:
        return f"{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} k{self.split_k}"

    def fits(self, n: int, k: int) -> bool:
        return n % self.block_n == 0 and k % (self.block_k * self.split_k) == 0


# The candidates: each (tile, prologue, 1 / 16 / 64 rows) is one compile at start-up.
# Checked with ptxas for sm_90 (Triton 3.9): none spills registers, with every prologue.
# One row: the best three of a sweep on the H200 (bench.engine.skinny_matmul --sweep,
# 2026-12-04: 36 tiles x 4 projections); no split-K tile won there, at 1 row or at 64.
ONE_ROW_TILES = (Tile(8, 1024), Tile(8, 512, num_stages=4), Tile(8, 512, num_warps=8))
DOT16_TILES = (Tile(32, 128, num_stages=4), Tile(64, 128, num_stages=4))
DOT64_TILES = (Tile(32, 64, num_warps=8, num_stages=4), Tile(64, 32, num_warps=8, num_stages=4))


def candidates(rows: int) -> tuple[Tile, ...]:
    if rows == 1:
        return ONE_ROW_TILES
    return DOT16_TILES if dot_rows(rows) == 16 else DOT64_TILES


_choices: dict[tuple[object, ...], Tile | TmaTile | None] = {}


@dataclass(frozen=True)
class Norm:
    """The RMSNorm in front of a matmul: ``norm(x + residual) * weight``."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None  # None: the norm of x alone
    summed: torch.Tensor | None = None  # where x + residual goes (program 0 writes it)


def row_bucket(rows: int) -> int:
    """The rows a choice is made for: 1, 2, 4, else the next multiple of 8 (the decode
    graphs' batch sizes up to 64); a bucket never mixes ``dot_rows``' two variants."""
    return rows if rows <= 2 else 4 if rows <= 4 else -(-rows // 8) * 8


def dot_rows(rows: int) -> int:
    """BLOCK_M for 2..64 rows: two variants only (each is a compile at start-up)."""
    return 16 if rows <= 16 else MAX_ROWS


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tile: Tile | TmaTile,
    gated: bool = False,
    norm: Norm | None = None,
) -> torch.Tensor:
    """``x [M, K] @ weight [N, K]^T (+ bias)``; ``gated``: x is gate|up ``[M, 2K]``;
    ``norm``: the input is the RMSNorm of x (+ its residual)."""
    from dynask.actors.engine.cuda import triton_gemv

    if isinstance(tile, TmaTile):
        return _launch_tma(x, weight, tile, gated, norm)
    rows = x.shape[0]
    n, k = weight.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    has_res = norm is not None and norm.residual is not None
    tensors = (
        bias if bias is not None else weight,
        out,
        norm.residual if norm is not None and norm.residual is not None else x,
        norm.summed if norm is not None and norm.summed is not None else x,
        norm.weight if norm is not None else x,
    )
    eps = norm.eps if norm is not None else 0.0
    flags = {"HAS_BIAS": bias is not None, "GATED": gated, "NORM": norm is not None}
    flags["HAS_RES"] = has_res
    grid = (n // tile.block_n, tile.split_k)
    block_m = 1 if rows == 1 else dot_rows(rows)
    launch_options = pdl.options(x.device)
    part, count = x, x  # unused placeholders unless split
    if tile.split_k > 1:
        part, count = _split_buffers(x.device, tile.split_k * block_m * n, grid[0])
    if rows == 1:
        triton_gemv.gemv_kernel[grid](
            x, weight, *tensors, part, count, eps, n, k, **flags, BLOCK_N=tile.block_n,
            BLOCK_K=tile.block_k, SPLIT_K=tile.split_k, num_warps=tile.num_warps,
            num_stages=tile.num_stages, **launch_options,
        )  # fmt: skip
        return out
    triton_gemv.skinny_matmul_kernel[grid](
        x, weight, *tensors, part, count, eps, rows, n, k, x.stride(0), out.stride(0), **flags,
        IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, SPLIT_K=tile.split_k, num_warps=tile.num_warps,
        num_stages=tile.num_stages, **launch_options,
    )  # fmt: skip
    return out


def _launch_tma(
    x: torch.Tensor, weight: torch.Tensor, tile: TmaTile, gated: bool, norm: Norm | None
) -> torch.Tensor:
    """A TMA tile: the prologue's unfused kernel first (``skinny_tma`` takes none); a
    norm's ``x + residual`` is not kept (``norm_linear`` runs the norm itself)."""
    if gated:
        x = fused_ops.silu_and_mul(x)
    elif norm is not None:
        x = fused_ops.add_rms_norm(x, norm.residual, norm.weight, norm.eps)[0]
    n, k = weight.shape
    part, count = weight, weight  # unused unless split
    floats = tile.split_floats(n, k, x.device)
    if floats:
        part, count = _split_buffers(x.device, floats, n // tile.block_n)
    return skinny_tma.launch(x, weight, tile, part, count)


# Split-K's float32 partials and per-n-tile arrival counts, one pair per device: a
# process's engine runs its model (eager steps, warm-up, graph replays) on one stream at a
# time, so one launch at a time uses them. The counts are back to zero after every launch
# (the last program of a tile resets its own). Outgrown pairs are kept: a captured CUDA
# graph may still point at them.
_splits: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_outgrown: list[tuple[torch.Tensor, torch.Tensor]] = []


def _split_buffers(
    device: torch.device, floats: int, tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    held = _splits.get(device)
    if held is not None and held[0].numel() >= floats and held[1].numel() >= tiles:
        return held
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Made inside a capture they would come from the graph's private pool (which its
        # replays reuse) with their zeroing recorded, not run: eager launches after it
        # would then read garbage counts and write over the graph's tensors.
        raise RuntimeError("split-K buffers must be sized before a CUDA-graph capture")
    if held is not None:
        _outgrown.append(held)
        floats, tiles = max(floats, held[0].numel()), max(tiles, held[1].numel())
    part = torch.empty(floats, dtype=torch.float32, device=device)
    count = torch.zeros(tiles, dtype=torch.int32, device=device)
    _splits[device] = (part, count)
    return part, count


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)``: at small batch on CUDA through the faster of cuBLAS and Triton."""
    tile = _tile_for(
        x,
        layer,
        "plain",
        lambda w: F.linear(x, w, layer.bias),
        lambda t, w: launch(x, w, layer.bias, t),
    )
    if tile is None:
        out: torch.Tensor = layer(x)
        return out
    return launch(x, layer.weight, layer.bias, tile)


def gated_linear(gate_up: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(silu(gate) * up)`` for ``gate_up = [M, 2K]``, SiLU fused where Triton wins."""
    tile = _tile_for(
        gate_up, layer, "gated",
        lambda w: F.linear(fused_ops.silu_and_mul(gate_up), w, layer.bias),
        lambda t, w: launch(gate_up, w, layer.bias, t, gated=True),
    )  # fmt: skip
    if tile is None:
        out: torch.Tensor = layer(fused_ops.silu_and_mul(gate_up))
        return out
    return launch(gate_up, layer.weight, layer.bias, tile, gated=True)


def norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    layer: nn.Linear,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer(rms_norm(x + residual)), x + residual)``, the norm fused where Triton wins."""
    eligible = x.is_contiguous() and norm_weight.is_contiguous()
    if residual is not None:
        eligible = eligible and residual.shape == x.shape and residual.is_contiguous()
    tile = None
    if eligible:

        def unfused(weight: torch.Tensor) -> torch.Tensor:
            normed = fused_ops.add_rms_norm(x, residual, norm_weight, eps)[0]
            return F.linear(normed, weight, layer.bias)

        def fused(t: Tile | TmaTile, weight: torch.Tensor) -> torch.Tensor:
            summed = None if residual is None else torch.empty_like(x)
            return launch(x, weight, layer.bias, t, norm=Norm(norm_weight, eps, residual, summed))

        kind = "norm+residual" if residual is not None else "norm"
        tile = _tile_for(x, layer, kind, unfused, fused)
    if tile is None or isinstance(tile, TmaTile):
        normed, summed = fused_ops.add_rms_norm(x, residual, norm_weight, eps)
        if tile is not None:
            return launch(normed, layer.weight, layer.bias, tile), summed
        out: torch.Tensor = layer(normed)
        return out, summed
    summed = x if residual is None else torch.empty_like(x)
    norm = Norm(norm_weight, eps, residual, None if residual is None else summed)
    return launch(x, layer.weight, layer.bias, tile, norm=norm), summed


def choices() -> dict[str, str]:
    """What was chosen so far, for benchmarks: ``"rows x N x K dtype kind" -> tile``."""
    named = {}
    for (rows, n, k, dtype, kind, _bias, _dev), tile in sorted(_choices.items(), key=str):
        key = f"{rows}x{n}x{k} {str(dtype).removeprefix('torch.')} {kind}"
        named[key] = "cublas" if tile is None else f"triton {tile}"
    return named


Unfused = Callable[[torch.Tensor], object]  # run with this weight
Fused = Callable[[Tile | TmaTile, torch.Tensor], object]  # run this tile with this weight


def _tile_for(
    x: torch.Tensor, layer: nn.Linear, kind: str, unfused: Unfused, fused: Fused
) -> Tile | TmaTile | None:
    """The tile to run ``layer`` on ``x`` with (None: the unfused torch ops), timed once
    per (row bucket, shape, dtype, kind): ``unfused`` against ``fused`` on each tile."""
    weight = layer.weight
    rows = x.shape[0] if x.dim() == 2 else 0
    if (
        x.device.type != "cuda"
        or x.dtype not in _DTYPES
        or weight.dtype != x.dtype
        or not 1 <= rows <= MAX_ROWS
        or x.stride(-1) != 1
        or not weight.is_contiguous()
    ):
        return None
    n, k = weight.shape
    key = (row_bucket(rows), n, k, x.dtype, kind, layer.bias is not None, x.device)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None  # nothing can be timed inside a capture: cuBLAS
        tiles: list[Tile | TmaTile] = [t for t in candidates(rows) if t.fits(n, k)]
        if skinny_tma.offered(x, weight, layer.bias):
            tiles += [t for t in skinny_tma.CANDIDATES if t.fits(n, k)]
        margin = PDL_MARGIN if pdl.enabled(x.device) else MARGIN
        _choices[key] = kernel_chooser.fastest(
            tiles, unfused, fused, kernel_chooser.cold_copies(weight), margin
        )
        log.debug("skinny matmul %s: %s", key[:5], _choices[key] or "cublas")
    return _choices[key]
