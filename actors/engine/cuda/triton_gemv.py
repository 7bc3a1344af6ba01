"""Triton source of the skinny matmul (imported only where Triton exists; see
``skinny_matmul`` for the design). mypy skips this file (Triton's DSL is untyped)."""

import triton
import triton.language as tl


# The row count varies with the batch: not specialised on (1 excepted: BLOCK_M says it).
@triton.jit(do_not_specialize=["m_rows"])
def skinny_matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    m_rows,
    k_dim,
    x_stride,
    y_stride,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # y[:, n-tile] = x @ w[n-tile, :]^T over the whole K (no split-K, no reduce kernel);
    # the caller guarantees N % BLOCK_N == 0 and K % BLOCK_K == 0. GATED: x is the fused
    # gate|up output [M, 2K] and the input is silu(gate) * up, rounded as silu_and_mul.
    # BLOCK_M >= 16 (tl.dot); one row goes to gemv_kernel.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = (m < m_rows)[:, None]
    kk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + n.to(tl.int64)[:, None] * k_dim + kk[None, :]
    x_ptrs = x_ptr + m[:, None] * x_stride + kk[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for _ in range(0, k_dim, BLOCK_K):
        w = tl.load(w_ptrs)
        x = tl.load(x_ptrs, mask=m_ok, other=0.0)
        if GATED:
            up = tl.load(x_ptrs + k_dim, mask=m_ok, other=0.0)
            g = x.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32)
            x = (act * up.to(tl.float32)).to(up.dtype)
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n).to(tl.float32)[None, :]
    y_ptrs = y_ptr + m[:, None] * y_stride + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok)


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    k_dim,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One row: y[n-tile] = w[n-tile, :] @ x. Products accumulate elementwise in a
    # [BLOCK_N, BLOCK_K] float32 tile, summed over K once after the loop (no reduction
    # per step); same divisibility and GATED input as skinny_matmul_kernel.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + n.to(tl.int64)[:, None] * k_dim + kk[None, :]
    x_ptrs = x_ptr + kk
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for _ in range(0, k_dim, BLOCK_K):
        w = tl.load(w_ptrs)
        x = tl.load(x_ptrs)
        if GATED:
            up = tl.load(x_ptrs + k_dim)
            g = x.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32)
            x = (act * up.to(tl.float32)).to(up.dtype)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + n).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty))
