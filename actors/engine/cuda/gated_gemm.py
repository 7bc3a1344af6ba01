"""The MLP's up projection with SiLU·mul in its epilogue, from 33 rows (prefill, batch 64+).

An 8,192-token prefill of an 8B Llama spends ~5 ms of its ~212 ms on the H200 in
``silu_and_mul``: it reads the ``[8192, 2 x 14336]`` gate|up output (470 MB) and writes
half of it back, at the copy bandwidth, in every layer. ``launch`` computes
``silu(x @ gate^T) * (x @ up^T)`` in one Triton GEMM (``triton_gated_gemm``: tensor
descriptors, persistent) whose epilogue writes only the product, rounded where the
unfused ops round. It pays only where the GEMM keeps up with cuBLAS's, which is timed at
start-up per row bucket (``decide``, ``tile_for``), on the GPU at hand, against
``F.linear`` then ``silu_and_mul``. On the H200 it ran 0.93x of that pair's time at
8,192 rows and 0.91x at 2,048 (``bench.engine.gated_gemm``), bit for bit the same
output there. At 33-64 rows (batch 64's decode) it competes with 64-row tiles, one
program per output tile; on an H100 the best took 0.95x of the pair's time
(``bench.engine.skinny_tma``). There the down projection after it still goes through
the skinny chooser (``skinny_matmul.linear``), so fusing SiLU·mul upstream never costs
down its own fast kernel; the timing compares gate|up alone, against cuBLAS + the
unfused SiLU·mul, and may favour the fused GEMM by the few microseconds a down kernel
with SiLU·mul inside (``skinny_matmul.gated_linear``) would have saved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dynask.actors.engine.cuda import fused_ops, kernel_chooser

log = logging.getLogger(__name__)

_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GatedTile:
    block_m: int
    block_n: int  # output columns per program (gate and up rows each)
    block_k: int
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8
    persistent: bool = True  # one program per SM walking the tiles; False: one per tile

    def __str__(self) -> str:
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} "
            f"s{self.num_stages} g{self.group_m}{'' if self.persistent else ' grid'}"
        )

    def fits(self, n: int, k: int) -> bool:
        """Whether the tile divides ``n`` output columns and a K of ``k``."""
        return n % self.block_n == 0 and k % self.block_k == 0


def eligible(x: torch.Tensor, layer: nn.Linear) -> bool:
    """Whether ``layer`` (a gate|up projection) can run fused on ``x``."""
    return x.device.type == "cuda" and layout_fits(x, layer)


def layout_fits(x: torch.Tensor, layer: nn.Linear) -> bool:
    """The rules but the device: half precision, no bias, rows and weight contiguous."""
    weight = layer.weight
    return (
        x.dim() == 2
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and layer.bias is None
        and x.stride(-1) == 1
        and weight.is_contiguous()
        and weight.shape[0] % 2 == 0
        and _descriptor_ready(x)
        and _descriptor_ready(weight)
    )


def _descriptor_ready(t: torch.Tensor) -> bool:
    """A tensor descriptor (TMA) wants a 16-byte aligned start and row stride."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def launch(
    x: torch.Tensor, weight: torch.Tensor, tile: GatedTile, programs: int = 0
) -> torch.Tensor:
    """``silu(x @ weight[:N]^T) * (x @ weight[N:]^T)`` for ``weight [2N, K]``, over
    ``programs`` programs (0: the tile's way, one per SM or one per output tile)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from dynask.actors.engine.cuda import triton_gated_gemm

    rows, k = x.shape
    n = weight.shape[0] // 2
    if not tile.fits(n, k) or weight.shape[1] != k:
        raise ValueError(f"tile {tile} does not fit a gate|up weight of {tuple(weight.shape)}")
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    tiles = -(-rows // tile.block_m) * (n // tile.block_n)
    if programs == 0 and tile.persistent:
        programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    elif programs == 0:
        programs = tiles
    programs = min(programs, tiles)
    triton_gated_gemm.gated_gemm_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [tile.block_m, tile.block_k]),
        TensorDescriptor.from_tensor(weight, [tile.block_n, tile.block_k]),
        TensorDescriptor.from_tensor(out, [tile.block_m, tile.block_n]),
        rows, n, k, programs, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, GROUP_M=tile.group_m, NUM_STAGES=tile.num_stages,
        num_warps=tile.num_warps,
    )  # fmt: skip
    return out


# The candidates, each one compile: the best of a sweep on the H200 (2026-12-05,
# bench.engine.gated_gemm: 0.93x of cuBLAS + silu_and_mul at 8,192 rows, 0.91x at 2,048,
# 0.97x at 256); which one wins here, or the unfused pair, is timed per GPU.
CANDIDATES = (GatedTile(128, 128, 64, 8, 3), GatedTile(128, 128, 64, 8, 4, group_m=16))
# For the 33-64-row bucket (batch 64's decode): the best two of a sweep on an H100
# (bench.engine.skinny_tma --rows 64, 2026-12-05: 0.948x and 0.995x of cuBLAS +
# silu_and_mul), one program per tile: 224 tiles at 64 rows fill 132 SMs better than a
# persistent walk did (1.01-1.02x there).
SMALL_CANDIDATES = (
    GatedTile(64, 64, 128, num_warps=4, num_stages=3, persistent=False),
    GatedTile(64, 32, 128, num_warps=4, num_stages=4, persistent=False),
)
MIN_ROWS = 33  # below: the skinny GEMVs (skinny_matmul) or cuBLAS
MARGIN = 0.97  # the fused GEMM is kept only when it takes at most this share of the pair's time

_choices: dict[tuple[object, ...], GatedTile | None] = {}


def row_bucket(rows: int) -> int:
    """The rows a choice is made for: the next power of two (one timing per bucket)."""
    return 1 << max(0, rows - 1).bit_length()


def tile_for(x: torch.Tensor, layer: nn.Linear) -> GatedTile | None:
    """The tile to run ``layer`` (gate|up) with SiLU·mul fused on ``x``, or None for cuBLAS
    then ``silu_and_mul``: timed once per (row bucket, shape, dtype, device), never inside a
    CUDA-graph capture (an undecided bucket there takes cuBLAS)."""
    if x.shape[0] < MIN_ROWS or not eligible(x, layer):
        return None
    weight = layer.weight
    n, k = weight.shape[0] // 2, weight.shape[1]
    bucket = row_bucket(x.shape[0])
    key = (bucket, n, k, x.dtype, x.device)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        offered = SMALL_CANDIDATES if bucket <= 64 else CANDIDATES
        tiles = [t for t in offered if t.fits(n, k)]
        _choices[key] = kernel_chooser.fastest(
            tiles,
            lambda w: fused_ops.silu_and_mul(F.linear(x, w)),
            lambda t, w: launch(x, w, t),
            kernel_chooser.cold_copies(weight),
            MARGIN,
        )
        log.debug("gated gemm %s: %s", key[:4], _choices[key] or "cublas")
    return _choices[key]


def decide(layer: nn.Linear, max_rows: int) -> None:
    """Times every row bucket up to ``max_rows`` now (start-up), so that no request's step
    waits for a timing; on random input (zeros draw less power and run faster)."""
    weight = layer.weight
    rows = row_bucket(MIN_ROWS)
    while max_rows >= MIN_ROWS and rows // 2 < max_rows:  # the bucket holds rows/2+1 .. rows
        x = torch.randn((rows, weight.shape[1]), device=weight.device, dtype=weight.dtype)
        tile_for(x, layer)
        rows *= 2


def choices() -> dict[str, str]:
    """What was chosen so far, for benchmarks: ``"rows<=B N x K dtype" -> tile``."""
    return {
        f"rows<={rows} {n}x{k} {str(dtype).removeprefix('torch.')}": str(tile or "cublas")
        for (rows, n, k, dtype, _dev), tile in sorted(_choices.items(), key=str)
    }
