"""Triton source of the paged prefill kernel with key splits (``EngineConfig.cuda_fast_paths``,
on by default since 2026-12-01).

``split_prefill_kernel`` is ``triton_kernels.prefill_kernel`` with a third grid axis: the
tile's keys are shared out over ``num_splits`` programs (a runtime argument, one compile
for every count), each writing its partial softmax (acc, m, l) to float32 scratch, which
``prefill_merge_kernel`` combines into the output. It is a module of its own so that the
kernel of before stays as it was for engines with the fast paths off. See
``triton_attention`` for the design; mypy skips this file (Triton's DSL is untyped).
"""

import triton
import triton.language as tl

from dynask.actors.engine.cuda.triton_kernels import attend


@triton.jit(
    do_not_specialize=["num_tiles", "q_stride", "table_stride", "num_splits"],
    do_not_specialize_on_alignment=["tables_ptr", "tiles_ptr"],
)
def split_prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    part_acc_ptr,
    part_ml_ptr,
    tables_ptr,
    tiles_ptr,
    num_tiles,
    q_stride,
    table_stride,
    scale_log2,
    num_splits,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOW: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(tiles_ptr + tile)
    q_start = tl.load(tiles_ptr + num_tiles + tile)
    q_len = tl.load(tiles_ptr + 2 * num_tiles + tile)
    q_pos = tl.load(tiles_ptr + 3 * num_tiles + tile)
    r = tl.arange(0, BLOCK_M)
    tok = r // GROUP
    r_ok = tok < q_len
    head = kv_head * GROUP + r % GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_row = (q_start + tok).to(tl.int64)
    q_offs = (q_row * q_stride + head * HEAD_DIM)[:, None] + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=r_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first = 0  # the first key any query of the tile sees
    if WINDOW > 0:
        first = tl.maximum(q_pos - WINDOW + 1, 0)
    # The tile's keys first .. q_pos + q_len - 1, shared out over the splits in whole key
    # tiles (a split past the end gets none and leaves m = -inf, l = 0).
    chunk = tl.cdiv(tl.cdiv(q_pos + q_len - first, num_splits), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(q_pos + q_len, lo + chunk)
    m_i, l_i, acc = attend(
        q,
        m_i,
        l_i,
        acc,
        k_ptr,
        v_ptr,
        tables_ptr + seq * table_stride,
        lo,
        hi,
        kv_head,
        q_pos + tok,
        dims,
        scale_log2,
        NUM_KV_HEADS,
        HEAD_DIM,
        BLOCK_SIZE,
        BLOCK_N,
        IEEE,
        WINDOW,
    )
    # Every split writes its partial softmax; prefill_merge_kernel combines them.
    part = ((tile * NUM_KV_HEADS + kv_head) * num_splits + split).to(tl.int64) * BLOCK_M + r
    tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc)
    tl.store(part_ml_ptr + part * 2, m_i)
    tl.store(part_ml_ptr + part * 2 + 1, l_i)


@triton.jit(
    do_not_specialize=["num_tiles", "num_splits"],
    do_not_specialize_on_alignment=["tiles_ptr"],
)
def prefill_merge_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    tiles_ptr,
    num_tiles,
    num_splits,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    # Combines the splits' partial softmaxes of one tile (rows as in split_prefill_kernel).
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(tiles_ptr + num_tiles + tile)
    q_len = tl.load(tiles_ptr + 2 * num_tiles + tile)
    r = tl.arange(0, BLOCK_M)
    tok = r // GROUP
    r_ok = tok < q_len
    head = kv_head * GROUP + r % GROUP
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    base = (tile * NUM_KV_HEADS + kv_head).to(tl.int64) * num_splits
    for split in range(num_splits):
        part = (base + split) * BLOCK_M + r
        m_part = tl.load(part_ml_ptr + part * 2)
        l_part = tl.load(part_ml_ptr + part * 2 + 1)
        m_new = tl.maximum(m, m_part)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        beta = tl.exp2(m_part - m_safe)
        acc_part = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :])
        acc = acc * alpha[:, None] + acc_part * beta[:, None]
        l_sum = l_sum * alpha + l_part * beta
        m = m_new
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    q_row = (q_start + tok).to(tl.int64)
    out_offs = ((q_row * NUM_HEADS + head) * HEAD_DIM)[:, None] + dims[None, :]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
