"""Triton source of the skinny matmul (imported only where Triton exists; see
``skinny_matmul`` for the design). mypy skips this file (Triton's DSL is untyped).

Both kernels compute ``y[:, n-tile] = input @ w[n-tile, :]^T``; the caller guarantees
N % BLOCK_N == 0 and K % (SPLIT_K * BLOCK_K) == 0. With SPLIT_K > 1 each n-tile's K is
cut into SPLIT_K programs (more programs than SMs when N / BLOCK_N alone is fewer, and
fewer re-reads of the input per weight byte): each writes its float32 partial to
``part``, counts itself in ``count[n-tile]``, and the last to arrive sums the partials in
split order (so the result does not depend on the order they ran in), writes y and resets
the count for the next launch. No second kernel, no zeroed buffer.
The input is ``x`` itself, or a prologue of it, rounded exactly where the unfused ops
round:

* GATED: ``x`` is the fused gate|up output ``[M, 2K]``; input = silu(gate) * up
  (as ``silu_and_mul_kernel``);
* NORM: input = rms_norm(x (+ res)) * norm weight (as ``add_rms_norm_kernel``); a first
  pass over K sums the squares, and program 0 writes x + res to ``res_out``.

With PDL (``pdl``; Hopper and later) each program lets the next kernel launch, reads its
first block of weights, and only then waits for the kernel before it (weights are never
written by a kernel); the K loop's first block is therefore peeled off (``_gemv_step`` /
``_dot_step``). Measured on the H200: prefetching into L2 instead of the peel was slower.
"""

import triton
import triton.language as tl


@triton.jit
def _row_rstd(
    x_ptrs,
    res_ptrs,
    mask,
    k_dim,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK_K: tl.constexpr,
    AXIS: tl.constexpr,
):
    # 1 / rms of each row of x (+ res), the sum rounded to the dtype first; AXIS is K's.
    sq = tl.zeros(x_ptrs.shape, tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        x = tl.load(x_ptrs + k0, mask=mask, other=0.0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(res_ptrs + k0, mask=mask, other=0.0)).to(x.dtype)
        x = x.to(tl.float32)
        sq += x * x
    return tl.rsqrt(tl.sum(sq, axis=AXIS) / k_dim + eps)


@triton.jit
def _prologue(
    x,
    x_ptrs,
    res_ptrs,
    res_out_ptrs,
    norm_w_ptrs,
    rstd,
    mask,
    k_dim,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    # The matmul's input for this K block, from x's block (see the module docstring).
    if GATED:
        up = tl.load(x_ptrs + k_dim, mask=mask, other=0.0)
        g = x.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32)
        x = (act * up.to(tl.float32)).to(up.dtype)
    if NORM:
        if HAS_RES:
            res = tl.load(res_ptrs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
            if tl.program_id(0) == 0:
                tl.store(res_out_ptrs, x, mask=mask)
        y = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
        x = (tl.load(norm_w_ptrs).to(tl.float32) * y).to(x.dtype)
    return x


@triton.jit
def _gemv_step(acc, w, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, mask, k_dim,
               GATED: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr):  # fmt: skip
    # acc + w * the input block at these pointers (one row: elementwise, summed later).
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    x = _prologue(
        x, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, mask, k_dim, GATED, NORM, HAS_RES
    )
    return acc + w.to(tl.float32) * x.to(tl.float32)[None, :]


@triton.jit
def _dot_step(acc, w, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, mask, k_dim,
              GATED: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
              IEEE: tl.constexpr):  # fmt: skip
    # acc + the input block at these pointers @ w^T (2..64 rows).
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    x = _prologue(
        x, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, mask, k_dim, GATED, NORM, HAS_RES
    )
    if IEEE:
        return acc + tl.dot(x, tl.trans(w), input_precision="ieee")
    return acc + tl.dot(x, tl.trans(w))


@triton.jit
def _store_out(acc, bias_ptr, y_ptrs, n, mask, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n).to(tl.float32)
    tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def last_of_split(acc, part_ptrs, part_stride, count_ptr, SPLIT_K: tl.constexpr):
    # (whether this program arrived last, the sum of every split's partial if it did)
    tl.store(part_ptrs + tl.program_id(1) * part_stride, acc)
    tl.debug_barrier()  # every thread's partial is written before the count says so
    arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    if last:
        acc = tl.load(part_ptrs, cache_modifier=".cg")  # from L2: another SM wrote them
        for s in tl.static_range(1, SPLIT_K):
            acc += tl.load(part_ptrs + s * part_stride, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tl.program_id(0), 0)
    return last, acc


# The row count varies with the batch: not specialised on.
@triton.jit(do_not_specialize=["m_rows"])
def skinny_matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    res_ptr,
    res_out_ptr,
    norm_w_ptr,
    part_ptr,
    count_ptr,
    eps,
    m_rows,
    n_dim,
    k_dim,
    x_stride,
    y_stride,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RES: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # 2..64 rows (BLOCK_M >= 16, tl.dot); NORM needs contiguous rows (x_stride = K).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = (m < m_rows)[:, None]
    k_len = k_dim // SPLIT_K
    kk = tl.arange(0, BLOCK_K)
    k_first = tl.program_id(1) * k_len
    w_ptrs = w_ptr + n.to(tl.int64)[:, None] * k_dim + (k_first + kk)[None, :]
    w = tl.load(w_ptrs)  # weights are never written: read before waiting (see pdl)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x_ptrs = x_ptr + m[:, None] * x_stride + kk[None, :]
    res_ptrs = res_ptr + m[:, None] * k_dim + kk[None, :]
    rstd = tl.zeros([BLOCK_M, 1], tl.float32)
    if NORM:  # over the whole row, whichever part of K this program takes
        rstd = _row_rstd(x_ptrs, res_ptrs, m_ok, k_dim, eps, HAS_RES, BLOCK_K, 1)[:, None]
    x_ptrs += k_first
    res_ptrs += k_first
    res_out_ptrs = res_out_ptr + m[:, None] * k_dim + (k_first + kk)[None, :]
    norm_w_ptrs = norm_w_ptr + (k_first + kk)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = _dot_step(
        acc, w, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, m_ok, k_dim, GATED, NORM,
        HAS_RES, IEEE,
    )  # fmt: skip
    for k0 in range(BLOCK_K, k_len, BLOCK_K):  # the first block is done above
        acc = _dot_step(
            acc, tl.load(w_ptrs + k0), x_ptrs + k0, res_ptrs + k0, res_out_ptrs + k0,
            norm_w_ptrs + k0, rstd, m_ok, k_dim, GATED, NORM, HAS_RES, IEEE,
        )  # fmt: skip
    y_ptrs = y_ptr + m[:, None] * y_stride + n[None, :]
    if SPLIT_K == 1:
        _store_out(acc, bias_ptr, y_ptrs, n[None, :], m_ok, HAS_BIAS)
    else:
        part_ptrs = part_ptr + m[:, None] * n_dim + n[None, :]
        last, acc = last_of_split(acc, part_ptrs, BLOCK_M * n_dim, count_ptr, SPLIT_K)
        if last:
            _store_out(acc, bias_ptr, y_ptrs, n[None, :], m_ok, HAS_BIAS)


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    res_ptr,
    res_out_ptr,
    norm_w_ptr,
    part_ptr,
    count_ptr,
    eps,
    n_dim,
    k_dim,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # One row: products accumulate elementwise in a [BLOCK_N, BLOCK_K] float32 tile,
    # summed over K once after the loop (no reduction per step).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_len = k_dim // SPLIT_K
    kk = tl.arange(0, BLOCK_K)
    k_first = tl.program_id(1) * k_len
    w_ptrs = w_ptr + n.to(tl.int64)[:, None] * k_dim + (k_first + kk)[None, :]
    w = tl.load(w_ptrs)  # weights are never written: read before waiting (see pdl)
    if PDL:
        tl.extra.cuda.gdc_wait()
    ok = kk < BLOCK_K  # all true: the prologue's masks
    rstd = 0.0
    if NORM:  # over the whole row, whichever part of K this program takes
        rstd = _row_rstd(x_ptr + kk, res_ptr + kk, ok, k_dim, eps, HAS_RES, BLOCK_K, 0)
    kk += k_first
    x_ptrs = x_ptr + kk
    res_ptrs = res_ptr + kk
    res_out_ptrs = res_out_ptr + kk
    norm_w_ptrs = norm_w_ptr + kk
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc = _gemv_step(
        acc, w, x_ptrs, res_ptrs, res_out_ptrs, norm_w_ptrs, rstd, ok, k_dim, GATED, NORM, HAS_RES
    )
    for k0 in range(BLOCK_K, k_len, BLOCK_K):  # the first block is done above
        acc = _gemv_step(
            acc, tl.load(w_ptrs + k0), x_ptrs + k0, res_ptrs + k0, res_out_ptrs + k0,
            norm_w_ptrs + k0, rstd, ok, k_dim, GATED, NORM, HAS_RES,
        )  # fmt: skip
    y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        _store_out(y, bias_ptr, y_ptr + n, n, n < n_dim, HAS_BIAS)
    else:
        last, y = last_of_split(y, part_ptr + n, n_dim, count_ptr, SPLIT_K)
        if last:
            _store_out(y, bias_ptr, y_ptr + n, n, n < n_dim, HAS_BIAS)
