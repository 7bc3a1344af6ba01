"""Triton source of the skinny GEMM through tensor descriptors (imported only where
Triton exists; see ``skinny_tma`` for the design). mypy skips this file (Triton's DSL is
untyped).

``y = x @ w^T`` for ``x [M, K]`` (M <= BLOCK_M, rows past M read as zeros and are not
stored) and ``w [N, K]``: program (n-tile, split) reads its ``BLOCK_N x K / SPLIT_K``
slice of the weight through a tensor descriptor (TMA on Hopper, pipelined NUM_STAGES
deep). With SPLIT_K > 1 the partials meet as in ``triton_gemv``: each program writes its
float32 partial, counts itself in ``count[n-tile]``, and the last to arrive sums them in
split order (``triton_gemv.last_of_split``), writes y and resets the count.
With PDL (``pdl``) each program lets the next kernel launch as it starts and waits for
the kernel before it before its first load (the pipelined loads of x and the weight are
not peeled apart).
"""

import triton
import triton.language as tl

from dynask.actors.engine.cuda.triton_gemv import last_of_split


@triton.jit(do_not_specialize=["m_rows"])
def skinny_tma_kernel(
    x_desc,
    w_desc,
    y_ptr,
    part_ptr,
    count_ptr,
    m_rows,
    n_dim,
    k_dim,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    IEEE: tl.constexpr,  # float32 in full precision (tl.dot's default is TF32 on a GPU)
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    off_n = tl.program_id(0) * BLOCK_N
    k_len = k_dim // SPLIT_K
    k_first = tl.program_id(1) * k_len
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(k_first, k_first + k_len, BLOCK_K, num_stages=NUM_STAGES):
        if IEEE:
            acc = tl.dot(
                x_desc.load([0, k]), w_desc.load([off_n, k]).T, acc, input_precision="ieee"
            )
        else:
            acc = tl.dot(x_desc.load([0, k]), w_desc.load([off_n, k]).T, acc)
    m = tl.arange(0, BLOCK_M)[:, None]
    n = off_n + tl.arange(0, BLOCK_N)[None, :]
    y_ptrs = y_ptr + m * n_dim + n
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m < m_rows)
    else:
        part_ptrs = part_ptr + m * n_dim + n
        last, acc = last_of_split(acc, part_ptrs, BLOCK_M * n_dim, count_ptr, SPLIT_K)
        if last:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m < m_rows)
