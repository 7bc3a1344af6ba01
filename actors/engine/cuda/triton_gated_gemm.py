"""Triton source of the gated up projection (imported only where Triton exists; see
``gated_gemm`` for the design). mypy skips this file (Triton's DSL is untyped).

``out[m, n] = silu(x @ w[n]^T) * (x @ w[N + n]^T)`` for a gate|up weight ``w`` of shape
``[2N, K]`` (gate rows, then up rows, as ``MLP.gate_up_proj`` holds them). Each tile of
``out`` (``BLOCK_M x BLOCK_N``) comes from two accumulators, one over the gate rows
``n .. n + BLOCK_N`` and one over the up rows ``N + n ..``, and only the product is
written: the ``[M, 2N]`` gate|up tensor never exists. The epilogue rounds where the
unfused ops round (``F.linear`` writes gate and up in the dtype; ``silu_and_mul_kernel``
rounds SiLU(gate) to the dtype before the product). Operands are read through tensor
descriptors (TMA on Hopper: rows past ``m_dim`` read as zeros and are not stored; loads
through pointers ran 1.25-1.28x slower on the H200), and the kernel is persistent:
``num_programs`` programs walk the tiles in grouped order. The caller guarantees
K % BLOCK_K == 0 and N % BLOCK_N == 0.
"""

import triton
import triton.language as tl


@triton.jit
def _epilogue(acc_gate, acc_up, dtype: tl.constexpr):
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


# The row count (every prefill chunk's own) and the program count are not specialised on:
# a value of another divisibility class than start-up's timing saw would compile the
# kernel again inside a request's step (~0.4 s, seen as a slower first batch on an H100).
@triton.jit(do_not_specialize=["m_dim", "num_programs"])
def gated_gemm_kernel(
    x_desc,
    w_desc,
    out_desc,
    m_dim,
    n_dim,
    k_dim,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    tiles_m = tl.cdiv(m_dim, BLOCK_M)
    tiles_n = n_dim // BLOCK_N
    # Grouped order: GROUP_M row tiles walk the column tiles together, so a weight tile
    # read from HBM serves GROUP_M tiles out of L2.
    per_group = GROUP_M * tiles_n
    dtype = out_desc.dtype
    for tile in range(tl.program_id(0), tiles_m * tiles_n, num_programs):
        first_m = (tile // per_group) * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_rows) * BLOCK_M
        off_n = ((tile % per_group) // group_rows) * BLOCK_N
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, k_dim, BLOCK_K, num_stages=NUM_STAGES):
            x = x_desc.load([off_m, k])
            acc_gate = tl.dot(x, w_desc.load([off_n, k]).T, acc_gate)
            acc_up = tl.dot(x, w_desc.load([n_dim + off_n, k]).T, acc_up)
        out_desc.store([off_m, off_n], _epilogue(acc_gate, acc_up, dtype))
