"""Triton source of the fused KV block copy (see ``block_copy`` for the design).

Imported only where CUDA and Triton exist; mypy skips this file (Triton's DSL is untyped).
One program copies one row (a block of one cache tensor) from the source base plus its
offset to the destination base plus its offset, ``BLOCK`` words per loop iteration: a
whole row of up to 32 KiB at once, so every load of the row is in flight before the
first store.
"""

import torch
import triton
import triton.language as tl

WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}
MAX_BLOCK = 8192  # words per iteration: a whole 32 KiB row of int32, 32 per thread at 8 warps


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
    for start in tl.static_range(0, ROW, BLOCK):
        words = start + tl.arange(0, BLOCK)
        if ROW % BLOCK == 0:
            tl.store(dst + d + words, tl.load(src + s + words))
        else:
            inside = words < ROW
            tl.store(dst + d + words, tl.load(src + s + words, mask=inside), mask=inside)


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
        num_warps=8 if block >= 4096 else 4 if block >= 512 else 1,
    )
