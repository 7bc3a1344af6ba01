"""A skinny GEMM for 17..64 rows (decode at batch 17..64) whose weight loads go through
tensor descriptors: one of the candidates ``skinny_matmul``'s chooser times.

At batch 64 an H200 profile (2026-12-04) had cuBLAS reading the q|k|v and o weights at
~70% of the copy bandwidth (16.7 and 11.6 µs against 12 and 8), and the Triton skinny
kernels that load through pointers (``triton_gemv``) were slower still. Here each program
takes ``BLOCK_N`` output columns over ``K / split_k`` and streams its weight slice through
TMA (Hopper), pipelined ``num_stages`` deep; the 64-row input block is read the same way
(rows past the batch read as zeros). Split partials meet as in ``triton_gemv`` (the last
program of a column tile sums them in split order; no reduce kernel).

A grid of (column tiles x splits) leaves SMs idle in its last wave: the q|k|v weight of
Llama-3.1-8B in 64-column tiles is 96 programs on an H200's 132 SMs, and cuBLAS's own
64x64 tile reads it at ~72% of the copy rate. A tile with ``stream_k`` > 0 runs
stream-K instead: ``stream_k`` programs per SM walk the (column tile, K block) units in
order, each the same number of units, and a column tile shared by two or more programs
is summed by the last of them to arrive, in K order (the same bits whatever the arrival
order).

No prologue runs inside it: where the chooser asks for a norm or SiLU·mul in front
(``skinny_matmul.norm_linear``, ``gated_linear``), the unfused small kernel runs first,
so a TMA tile competes with cuBLAS on equal terms. Only bias-free half-precision layers
whose rows and weight start on 16 bytes (a descriptor's rule) are offered to it; whether
it wins is timed per GPU (``bench.engine.skinny_tma`` sweeps the tiles).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynask.actors.engine.cuda import pdl

BLOCK_M = 64
_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class TmaTile:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    stream_k: int = 0  # > 0: stream-K over this many programs per SM (split_k unused)

    def __str__(self) -> str:
        split = f"stream{self.stream_k}" if self.stream_k else f"k{self.split_k}"
        return f"tma {self.block_n}x{self.block_k} {split} w{self.num_warps} s{self.num_stages}"

    def fits(self, n: int, k: int) -> bool:
        if self.stream_k:
            return n % self.block_n == 0 and k % self.block_k == 0
        return n % self.block_n == 0 and k % (self.block_k * self.split_k) == 0

    def programs(self, n: int, k: int, device: torch.device) -> int:
        """Stream-K's program count for an ``n x k`` weight: never more than its units."""
        units = n // self.block_n * (k // self.block_k)
        return max(1, min(units, self.stream_k * multiprocessors(device)))

    def split_floats(self, n: int, k: int, device: torch.device) -> int:
        """The float32 partials it needs (0: none)."""
        if self.stream_k:
            return 2 * self.programs(n, k, device) * BLOCK_M * self.block_n
        return self.split_k * BLOCK_M * n if self.split_k > 1 else 0


# The candidates at 17..64 rows, each one compile: chosen before any sweep on a GPU (a
# column tile of 32 or 64 with K split two or four ways gives 128..1,792 programs for the
# 8B shapes; see bench.engine.skinny_tma for the sweep that decides them), and two
# stream-K tiles (one 64-column program per SM; two 32-column ones).
CANDIDATES = (
    TmaTile(64, 128, 2),
    TmaTile(32, 128, 2),
    TmaTile(64, 128, 4),
    TmaTile(64, 128, stream_k=1),
    TmaTile(32, 128, stream_k=2),
)


def multiprocessors(device: torch.device) -> int:
    """SMs of a GPU; under Triton's interpreter (a CPU tensor) a nominal 4."""
    if device.type != "cuda":
        return 4
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def offered(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the TMA tiles may run ``x @ weight^T`` (besides fitting the shape)."""
    return x.device.type == "cuda" and layout_fits(x, weight, bias)


def layout_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The rules but the device: 17..64 rows, half precision, no bias, rows and weight
    on 16-byte boundaries with unit column stride."""
    return (
        x.dim() == 2
        and 16 < x.shape[0] <= BLOCK_M
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and bias is None
        and _descriptor_ready(x)
        and _descriptor_ready(weight)
    )


def _descriptor_ready(t: torch.Tensor) -> bool:
    return (
        t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
    )


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    tile: TmaTile,
    part: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """``x @ weight^T`` for at most 64 rows; ``part`` (>= ``tile.split_floats`` floats)
    and ``count`` (>= N / block_n zeros) are the partials' buffers (unused unsplit)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from dynask.actors.engine.cuda import triton_skinny_tma

    rows, k = x.shape
    n = weight.shape[0]
    if rows > BLOCK_M or not tile.fits(n, k) or weight.shape[1] != k:
        raise ValueError(f"tile {tile} does not fit {rows} rows of a {tuple(weight.shape)} weight")
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    tiles = n // tile.block_n
    if tile.stream_k:
        triton_skinny_tma.skinny_tma_stream_kernel[(tile.programs(n, k, x.device),)](
            TensorDescriptor.from_tensor(x, [BLOCK_M, tile.block_k]),
            TensorDescriptor.from_tensor(weight, [tile.block_n, tile.block_k]),
            out, part, count, rows, n, k, BLOCK_M=BLOCK_M, BLOCK_N=tile.block_n,
            BLOCK_K=tile.block_k, NUM_STAGES=tile.num_stages, IEEE=x.dtype == torch.float32,
            num_warps=tile.num_warps, **pdl.options(x.device),
        )  # fmt: skip
        return out
    triton_skinny_tma.skinny_tma_kernel[(tiles, tile.split_k)](
        TensorDescriptor.from_tensor(x, [BLOCK_M, tile.block_k]),
        TensorDescriptor.from_tensor(weight, [tile.block_n, tile.block_k]),
        out, part, count, rows, n, k, BLOCK_M=BLOCK_M, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, SPLIT_K=tile.split_k, NUM_STAGES=tile.num_stages,
        IEEE=x.dtype == torch.float32, num_warps=tile.num_warps, **pdl.options(x.device),
    )  # fmt: skip
    return out
