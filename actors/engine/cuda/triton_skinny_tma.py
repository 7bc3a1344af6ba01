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


@triton.jit(do_not_specialize=["m_rows"])
def skinny_tma_stream_kernel(
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
    NUM_STAGES: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    # Stream-K: the (n-tile, K block) units in order, program p taking units
    # [p * W // P, (p + 1) * W // P), so every program streams the same share of the weight
    # whatever the tile count (no partial last wave). A tile one program covers whole is
    # stored at once; a tile shared by programs p_lo..p_hi is summed by the last of them to
    # arrive, partials in program (= K) order, so its bits do not depend on arrival order.
    # Program p's partial of its first tile goes to slot 2p, of its last tile to 2p + 1.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = k_dim // BLOCK_K
    work = (n_dim // BLOCK_N) * blocks
    unit = pid * work // programs
    end = (pid + 1) * work // programs
    first_tile = unit // blocks
    m = tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    tile_floats = BLOCK_M * BLOCK_N
    while unit < end:
        tile = unit // blocks
        k_first = unit - tile * blocks
        k_last = tl.minimum(blocks, k_first + end - unit)
        off_n = tile * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in tl.range(k_first, k_last, num_stages=NUM_STAGES):
            k = kb * BLOCK_K
            if IEEE:
                acc = tl.dot(
                    x_desc.load([0, k]), w_desc.load([off_n, k]).T, acc, input_precision="ieee"
                )
            else:
                acc = tl.dot(x_desc.load([0, k]), w_desc.load([off_n, k]).T, acc)
        y_ptrs = y_ptr + m * n_dim + off_n + cols
        if k_first == 0 and k_last == blocks:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m < m_rows)
        else:
            slot = 2 * pid + (tile != first_tile).to(tl.int32)
            tl.store(part_ptr + slot * tile_floats + m * BLOCK_N + cols, acc)
            tl.debug_barrier()  # every thread's partial is written before the count says so
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            # The programs holding this tile's first and last unit (the largest p with
            # p * W // P <= u is ((u + 1) * P - 1) // W).
            p_lo = ((tile * blocks + 1) * programs - 1) // work
            p_hi = (((tile + 1) * blocks) * programs - 1) // work
            if arrived == p_hi - p_lo:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for q in range(p_lo, p_hi + 1):
                    q_first = (q * work // programs) // blocks
                    q_slot = 2 * q + (tile != q_first).to(tl.int32)
                    total += tl.load(
                        part_ptr + q_slot * tile_floats + m * BLOCK_N + cols,
                        cache_modifier=".cg",  # from L2: other SMs wrote them
                    )
                tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=m < m_rows)
                tl.atomic_xchg(count_ptr + tile, 0)
        unit += k_last - k_first
