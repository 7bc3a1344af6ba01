"""The decoder's small ops, fused into one Triton kernel each on CUDA.

At batch 1 an 8B model's decode step is ~4 ms of weight reads, but the eager RMSNorm
(7 ops), RoPE (~12 ops), the residual adds and SiLU·mul launched ~30 tiny kernels per
layer, ~2 ms in all even inside a CUDA graph. On CUDA each group below is one kernel:

* ``add_rms_norm``: residual add + RMSNorm (the add feeds the next residual);
* ``rotary_and_store``: RoPE on q and k in place in the fused qkv output, then k and v
  written into their cache slots (``paged_attention`` then skips its own write);
* ``silu_and_mul``: SiLU(gate) · up over the fused gate|up output.

The kernels round to the model dtype exactly where transformers' eager ops do (after
the residual add, after normalising, after each RoPE product and sum, after SiLU), so
greedy output keeps matching HF in bf16 as closely as the eager ops did. On a CPU, or for
shapes the kernels do not take, the same functions run the plain torch ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dynask.actors.engine.cuda import pdl
from dynask.actors.engine.cuda.triton_attention import load_kernels, next_power_of_2
from dynask.kv.block import ceil_div

MAX_FUSED_COLS = 16384  # one program holds a whole row of the norm


def _fused(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and x.is_contiguous()


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; without a residual, ``(rms_norm(x), x)``."""
    cols = x.shape[-1]
    plain = not _fused(x) or cols > MAX_FUSED_COLS
    if plain or (residual is not None and not residual.is_contiguous()):
        summed = x if residual is None else residual + x
        return _rms_norm_torch(summed, weight, eps), summed
    rows = x.numel() // cols
    out = torch.empty_like(x)
    summed = x if residual is None else torch.empty_like(x)
    load_kernels().add_rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, summed, cols, eps,
        HAS_RES=residual is not None, BLOCK=next_power_of_2(cols), num_warps=8,
        **pdl.options(x.device),
    )  # fmt: skip
    return out, summed


def _rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [..., 2 * n]``."""
    n = gate_up.shape[-1] // 2
    if not _fused(gate_up):
        return F.silu(gate_up[..., :n]) * gate_up[..., n:]
    rows = gate_up.numel() // (2 * n)
    out = torch.empty((*gate_up.shape[:-1], n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    load_kernels().silu_and_mul_kernel[(rows, ceil_div(n, block))](
        gate_up, out, n, BLOCK=block, **pdl.options(gate_up.device)
    )
    return out


def can_fuse_rotary(qkv: torch.Tensor, head_dim: int) -> bool:
    return _fused(qkv) and head_dim == next_power_of_2(head_dim) and head_dim >= 16


def rotary_and_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> None:
    """RoPE on the q and k parts of ``qkv [tokens, (h + 2 kv) * d]`` in place; k, v cached."""
    head_dim = cos.shape[-1]
    load_kernels().rotary_store_kernel[(qkv.shape[0],)](
        qkv, positions, cos, sin, kv_cache[0], kv_cache[1], slots, qkv.stride(0),
        cos.stride(0), NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=next_power_of_2(max(num_heads, num_kv_heads)), HALF=head_dim // 2, num_warps=4,
        **pdl.options(qkv.device),
    )  # fmt: skip
