"""Triton source of the paged-attention kernels (imported only where Triton exists).

Kept apart from ``triton_attention`` because Triton resolves the helpers a kernel calls
through this module's globals, and because the CPU install has no Triton. See
``triton_attention`` for the design; mypy skips this file (Triton's DSL is untyped).
"""

import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    # A kernel launched with PDL (see pdl): wait for the kernel before it, then let the
    # next one launch.
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def attend(
    q,
    m_i,
    l_i,
    acc,
    k_ptr,
    v_ptr,
    table_ptr,
    lo,
    hi,
    kv_head,
    q_last_pos,
    dims,
    scale_log2,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOW: tl.constexpr,
):
    # Keys lo .. hi - 1; query row r sees keys up to q_last_pos[r] (causal), and with a
    # sliding window (WINDOW > 0) only the last WINDOW of them, itself included.
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        block = tl.load(table_ptr + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        slot = block * BLOCK_SIZE + n % BLOCK_SIZE
        offs = (slot * NUM_KV_HEADS + kv_head)[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_ptr + offs, mask=n_ok[:, None], other=0.0)
        if IEEE:  # noqa: SIM108 (a compile-time branch in Triton)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        visible = (n[None, :] <= q_last_pos[:, None]) & n_ok[None, :]
        if WINDOW > 0:
            visible = visible & (n[None, :] > q_last_pos[:, None] - WINDOW)
        qk = tl.where(visible, qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs, mask=n_ok[:, None], other=0.0)
        if IEEE:  # noqa: SIM108 (a compile-time branch in Triton)
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


# Arguments whose value or alignment varies from step to step are not specialised on:
# each new specialisation is a compile (~0.5 s) in the middle of serving.
@triton.jit(
    do_not_specialize=["q_stride", "table_stride"],
    do_not_specialize_on_alignment=["tables_ptr", "seq_lens_ptr"],
)
def decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    tables_ptr,
    seq_lens_ptr,
    q_stride,
    table_stride,
    scale_log2,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOW: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + row)
    if seq_len > 0:
        r = tl.arange(0, BLOCK_M)
        r_ok = r < GROUP
        head = kv_head * GROUP + r
        dims = tl.arange(0, HEAD_DIM)
        q_offs = row * q_stride + head[:, None] * HEAD_DIM + dims[None, :]
        q = tl.load(q_ptr + q_offs, mask=r_ok[:, None], other=0.0)
        out_offs = (row * NUM_HEADS + head)[:, None] * HEAD_DIM + dims[None, :]
        # The keys this row sees: all, or the last WINDOW; the splits share them out.
        first = 0
        if WINDOW > 0:
            first = tl.maximum(seq_len - WINDOW, 0)
        chunk = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = first + split * chunk
        hi = tl.minimum(seq_len, lo + chunk)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        last = tl.zeros([BLOCK_M], tl.int32) + seq_len - 1
        m_i, l_i, acc = attend(
            q,
            m_i,
            l_i,
            acc,
            k_ptr,
            v_ptr,
            tables_ptr + row * table_stride,
            lo,
            hi,
            kv_head,
            last,
            dims,
            scale_log2,
            NUM_KV_HEADS,
            HEAD_DIM,
            BLOCK_SIZE,
            BLOCK_N,
            IEEE,
            WINDOW,
        )
        if NUM_SPLITS == 1:
            out = acc / l_i[:, None]
            tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
        else:
            part = (row * NUM_HEADS + head) * NUM_SPLITS + split
            tl.store(
                part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=r_ok[:, None]
            )
            tl.store(part_ml_ptr + part * 2, m_i, mask=r_ok)
            tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=r_ok)


@triton.jit
def merge_kernel(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    seq_lens_ptr,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    if tl.load(seq_lens_ptr + row) > 0:
        splits = tl.arange(0, NUM_SPLITS)
        dims = tl.arange(0, HEAD_DIM)
        part = (row * NUM_HEADS + head) * NUM_SPLITS + splits
        m = tl.load(part_ml_ptr + part * 2)
        l_part = tl.load(part_ml_ptr + part * 2 + 1)
        m_max = tl.max(m, 0)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
        acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :])
        total = tl.sum(acc * weight[:, None], 0) / tl.sum(l_part * weight, 0)
        offs = (row * NUM_HEADS + head) * HEAD_DIM + dims
        tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty))


@triton.jit(
    do_not_specialize=["num_tiles", "q_stride", "table_stride"],
    do_not_specialize_on_alignment=["tables_ptr", "tiles_ptr"],
)
def prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    tiles_ptr,
    num_tiles,
    q_stride,
    table_stride,
    scale_log2,
    NUM_HEADS: tl.constexpr,
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
    out_offs = ((q_row * NUM_HEADS + head) * HEAD_DIM)[:, None] + dims[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first = 0  # the first key any query of the tile sees
    if WINDOW > 0:
        first = tl.maximum(q_pos - WINDOW + 1, 0)
    m_i, l_i, acc = attend(
        q,
        m_i,
        l_i,
        acc,
        k_ptr,
        v_ptr,
        tables_ptr + seq * table_stride,
        first,
        q_pos + q_len,
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
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])


@triton.jit
def add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    # Rounds to the tensor dtype wherever transformers' eager ops round.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
        x = (x + r).to(dtype)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=ok)
        x = x.to(tl.float32)
    variance = tl.sum(x * x, 0) / n_cols
    y = (x * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (w * y).to(dtype), mask=ok)


@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def rotary_store_kernel(
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    row_stride,
    cos_stride,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    # One token: RoPE on its q and k heads in place (as q*cos + rotate_half(q)*sin, each
    # product and the sum rounded like transformers' ops), then k and v into the cache.
    token = tl.program_id(0).to(tl.int64)
    half = HALF
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + token)
    slot = tl.load(slot_ptr + token)
    base = qkv_ptr + token * row_stride
    dtype = qkv_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * cos_stride + dims).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * cos_stride + dims).to(dtype).to(tl.float32)[None, :]
    for part in tl.static_range(2):
        count = NUM_HEADS if part == 0 else NUM_KV_HEADS
        start = 0 if part == 0 else NUM_HEADS * HEAD_DIM
        ok = (heads < count)[:, None]
        first = base + start + heads[:, None] * HEAD_DIM + dims[None, :]
        x1 = tl.load(first, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(first + half, mask=ok, other=0.0).to(tl.float32)
        out1 = (x1 * cos).to(dtype) - (x2 * sin).to(dtype)
        out2 = (x2 * cos).to(dtype) + (x1 * sin).to(dtype)
        tl.store(first, out1.to(dtype), mask=ok)
        tl.store(first + half, out2.to(dtype), mask=ok)
        if part == 1:
            cache = (slot * NUM_KV_HEADS + heads[:, None]) * HEAD_DIM + dims[None, :]
            tl.store(k_cache_ptr + cache, out1.to(dtype), mask=ok)
            tl.store(k_cache_ptr + cache + half, out2.to(dtype), mask=ok)
            v_first = first + NUM_KV_HEADS * HEAD_DIM
            tl.store(v_cache_ptr + cache, tl.load(v_first, mask=ok), mask=ok)
            tl.store(v_cache_ptr + cache + half, tl.load(v_first + half, mask=ok), mask=ok)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    gate = tl.load(x_ptr + row * 2 * n_cols + cols, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * 2 * n_cols + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (act * up).to(gate.dtype), mask=ok)
