"""Triton source of the fused KV block copy (see ``block_copy`` for the design).

Imported only where CUDA and Triton exist; mypy skips this file (Triton's DSL is untyped).
One program copies one row (a block of one cache tensor) from the source base plus its
offset to the destination base plus its offset, ``BLOCK`` words per loop iteration: a
whole row of up to 32 KiB at once, so every load of the row is in flight before the
first store. ``launch`` takes each row's offsets; ``launch_ids`` takes the block ids and
each tensor's start and computes the offsets in the kernel (program (block, tensor)), so a
transfer needs no torch ops on the device before its launch (one upload of the ids).
"""

import torch
import triton
import triton.language as tl

WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
MAX_BLOCK = 8192  # words per iteration: a whole 32 KiB row of int32, 32 per thread at 8 warps


@triton.jit
def _copy_row(src, dst, s, d, ROW: tl.constexpr, BLOCK: tl.constexpr):
    """One row of ``ROW`` words from ``src + s`` to ``dst + d``, ``BLOCK`` words a step."""
    for start in tl.static_range(0, ROW, BLOCK):
        words = start + tl.arange(0, BLOCK)
        if ROW % BLOCK == 0:
            tl.store(dst + d + words, tl.load(src + s + words))
        else:
            inside = words < ROW
            tl.store(dst + d + words, tl.load(src + s + words, mask=inside), mask=inside)


@triton.jit
def _copy_rows(
    src,
    dst,
    src_offsets,
    dst_offsets,
    ROW: tl.constexpr,
    ALIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.multiple_of(tl.load(src_offsets + row), ALIGN)
    d = tl.multiple_of(tl.load(dst_offsets + row), ALIGN)
    _copy_row(src, dst, s, d, ROW, BLOCK)


# num_blocks changes per transfer: not specialized on (== 1, % 16), so no transfer after
# the first compiles again (a compile on the event loop would stall it for ~0.5 s).
@triton.jit(do_not_specialize=["num_blocks"])
def _copy_block_ids(
    src,
    dst,
    src_starts,
    dst_starts,
    ids,
    num_blocks,
    ROW: tl.constexpr,
    ALIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    block = tl.program_id(0)
    tensor = tl.program_id(1)
    s = tl.load(src_starts + tensor) + tl.load(ids + block) * ROW
    d = tl.load(dst_starts + tensor) + tl.load(ids + num_blocks + block) * ROW
    s = tl.multiple_of(s, ALIGN)
    d = tl.multiple_of(d, ALIGN)
    _copy_row(src, dst, s, d, ROW, BLOCK)


def _num_warps(block):
    return 8 if block >= 4096 else 4 if block >= 512 else 1


def launch_ids(src_base, dst_base, src_starts, dst_starts, ids, word_bytes, row_words, align):
    """Copies block ``ids[i]`` of every source tensor into block ``ids[n + i]`` of its
    destination (``ids``: int64 on the device, the sources' ids then the destinations';
    ``*_starts``: each tensor's start in words from its side's base) on the current stream."""
    dtype = WORD_DTYPES[word_bytes]
    block = min(triton.next_power_of_2(row_words), MAX_BLOCK)
    num_blocks = ids.numel() // 2
    _copy_block_ids[(num_blocks, src_starts.numel())](
        triton.reinterpret(src_base, dtype),
        triton.reinterpret(dst_base, dtype),
        src_starts,
        dst_starts,
        ids,
        num_blocks,
        ROW=row_words,
        ALIGN=align,
        BLOCK=block,
        num_warps=_num_warps(block),
    )


def launch(table, src_base, dst_base, src_offsets, dst_offsets):
    """Copies every row of ``table`` (a ``block_copy.RowTable``) on the current stream;
    ``src_base``/``dst_base`` are the tensors at its base addresses, the offsets are on
    the device."""
    dtype = WORD_DTYPES[table.word_bytes]
    block = min(triton.next_power_of_2(table.row_words), MAX_BLOCK)
    _copy_rows[(table.rows,)](
        triton.reinterpret(src_base, dtype),
        triton.reinterpret(dst_base, dtype),
        src_offsets,
        dst_offsets,
        ROW=table.row_words,
        ALIGN=table.align_words,
        BLOCK=block,
        num_warps=_num_warps(block),
    )
