"""Copying whole KV blocks between paged caches: one launch over a table of rows.

Design decisions:

- A paged cache is many tensors (K and V per layer; dim 0: block), so moving n blocks
  tensor by tensor costs 2 x layers x runs copies: 64 launches for an 8k-token prompt of
  Llama-3.1-8B's shape, and a gather plus a scatter per tensor once the blocks are
  scattered (measured on the H200: 29% and 13% of a device copy of the same bytes).
  ``copy_blocks`` plans the copy as rows instead: one row per tensor and block, each a
  block of one tensor (the same bytes for every tensor of a cache), and one Triton
  kernel (``block_copy_kernel``) copies every row: one launch whatever the layout.
- ``row_table`` is the plan, pure arithmetic on addresses (checked on a CPU): a row is an
  offset pair from one base address per side (the first tensor's), in words. The word
  is 4, 2 or 1 bytes, the widest that divides every address and the row's size, and the
  kernel is told the offsets' common factor (up to 16 bytes), so on a cache of aligned
  tensors its loads and stores are 16 bytes wide.
- The fused copy runs on a stream of its own and waits only for it: a device-wide
  synchronise would also wait for whatever the engine's thread has queued meanwhile (a
  whole prefill step). So the sources' writes must be finished when it is called; the
  engine's are (a step ends by reading its sampled tokens back).
- Every row's block id is checked against its tensor's length first: the kernel writes
  through raw addresses, so an id past the end would land in someone else's memory.
- Without CUDA or Triton (CPU engines, tests), or with tensors on several devices, the
  blocks are copied tensor by tensor as before: slices per run of consecutive blocks,
  one gather per tensor when fragmented.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

MAX_RUNS_AS_SLICES = 64  # per-tensor path: more runs than this, one gather per tensor
MAX_ALIGN_BYTES = 16  # the widest load the kernel is promised


@dataclass(frozen=True)
class RowTable:
    """One launch's work: row i moves ``row_words`` words from ``src_base + src_offsets[i]
    words`` to ``dst_base + dst_offsets[i] words``; every offset is a multiple of
    ``align_words``. Rows run tensor by tensor, block by block."""

    src_base: int
    dst_base: int
    src_offsets: torch.Tensor  # int64, CPU
    dst_offsets: torch.Tensor
    word_bytes: int  # 4, 2 or 1
    row_words: int
    align_words: int

    @property
    def rows(self) -> int:
        return int(self.src_offsets.numel())

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_words * self.word_bytes


def block_runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(source start, destination start, length) of runs consecutive on both sides."""
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
    runs: list[tuple[int, int, int]] = []
    for src, dst in zip(src_ids, dst_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            start_src, start_dst, length = runs[-1]
            runs[-1] = (start_src, start_dst, length + 1)
        else:
            runs.append((src, dst, 1))
    return runs


def check_caches(sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> None:
    """``ValueError`` unless both sides hold the same tensors' kind, pairwise."""
    if len(sources) != len(destinations):
        raise ValueError(f"{len(sources)} cache tensors here, {len(destinations)} there")
    for src, dst in zip(sources, destinations, strict=True):
        if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
            raise ValueError(
                f"cache blocks differ: {src.dtype}{list(src.shape[1:])} here, "
                f"{dst.dtype}{list(dst.shape[1:])} there"
            )


def row_table(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
) -> RowTable | None:
    """The rows that copy ``src_ids`` of every source into ``dst_ids`` of its
    destination; None when the caches do not fit one table (a tensor that is not
    contiguous, or blocks of different sizes across tensors). ``ValueError`` for
    mismatched caches or an id outside its tensor."""
    check_caches(sources, destinations)
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
    tensors = [*sources, *destinations]
    if not tensors or not all(t.is_contiguous() and t.dim() >= 1 for t in tensors):
        return None
    row_bytes = {t[0].numel() * t.element_size() for t in tensors if t.shape[0] > 0}
    if len(row_bytes) != 1:
        return None
    (row,) = row_bytes
    for ids, side in ((src_ids, sources), (dst_ids, destinations)):
        if ids and (min(ids) < 0 or max(ids) >= min(t.shape[0] for t in side)):
            raise ValueError(
                f"block ids {min(ids)}..{max(ids)} for caches of "
                f"{min(t.shape[0] for t in side)} blocks"
            )
    addresses = [t.data_ptr() for t in tensors]
    common = math.gcd(row, *addresses)
    word = 4 if common % 4 == 0 else 2 if common % 2 == 0 else 1
    src_offsets = _offsets(sources, src_ids, row) // word
    dst_offsets = _offsets(destinations, dst_ids, row) // word
    return RowTable(
        src_base=sources[0].data_ptr(),
        dst_base=destinations[0].data_ptr(),
        src_offsets=src_offsets,
        dst_offsets=dst_offsets,
        word_bytes=word,
        row_words=row // word,
        align_words=math.gcd(common, MAX_ALIGN_BYTES) // word,
    )


def _offsets(tensors: Sequence[torch.Tensor], ids: Sequence[int], row_bytes: int) -> torch.Tensor:
    """Bytes from the first tensor's address to each (tensor, block) row, tensor-major."""
    base = tensors[0].data_ptr()
    starts = torch.tensor([t.data_ptr() - base for t in tensors], dtype=torch.int64)
    blocks = torch.tensor(list(ids), dtype=torch.int64) * row_bytes
    return (starts[:, None] + blocks[None, :]).reshape(-1)


def copy_blocks(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
) -> None:
    """Copies blocks ``src_ids`` of every source into ``dst_ids`` of its destination and
    returns when the copy is finished: one fused launch on a GPU (module docstring),
    tensor by tensor elsewhere."""
    table = (
        row_table(sources, src_ids, destinations, dst_ids)
        if _fusable(sources, destinations)
        else None
    )
    if table is None:
        copy_blocks_per_tensor(sources, src_ids, destinations, dst_ids)
    elif table.rows:
        copy_rows(table, sources[0], destinations[0])


def _fusable(sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> bool:
    """One CUDA device holds every tensor (an IPC-opened cache of the same GPU counts),
    and Triton is there."""
    if not sources or sources[0].device.type != "cuda":
        return False
    device = sources[0].device
    return all(t.device == device for t in (*sources, *destinations)) and _kernel() is not None


def copy_rows(table: RowTable, src_base: torch.Tensor, dst_base: torch.Tensor) -> None:
    """Runs ``table`` in one launch on ``src_base``'s device, on a stream of its own, and
    returns when it is done; the bases are the tensors at the table's base addresses."""
    kernel = _kernel()
    if kernel is None or (src_base.data_ptr(), dst_base.data_ptr()) != (
        table.src_base,
        table.dst_base,
    ):
        raise ValueError("copy_rows needs CUDA, Triton and the table's own base tensors")
    device = src_base.device
    stream = _copy_stream(device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        src_offsets = table.src_offsets.to(device, non_blocking=True)
        dst_offsets = table.dst_offsets.to(device, non_blocking=True)
        kernel(table, src_base, dst_base, src_offsets, dst_offsets)
    stream.synchronize()  # type: ignore[no-untyped-call]


@cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


@cache
def _kernel() -> Any:
    """The launcher of ``block_copy_kernel``, or None without CUDA or Triton."""
    if not torch.cuda.is_available():
        return None
    try:
        from dynask.kv.block_copy_kernel import launch
    except ImportError:
        return None
    return launch


def copy_blocks_per_tensor(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
) -> None:
    """Copies blocks tensor by tensor (slices per run, or one gather when fragmented) on
    the current stream and waits until the copies finished."""
    check_caches(sources, destinations)
    runs = block_runs(src_ids, dst_ids)
    gather = len(runs) > MAX_RUNS_AS_SLICES
    if gather:  # the indices go to the devices once, not once per tensor
        src_index = torch.tensor(list(src_ids), device=sources[0].device)
        dst_index = torch.tensor(list(dst_ids), device=destinations[0].device)
    for src, dst in zip(sources, destinations, strict=True):
        if gather:  # rows of whole blocks: one gather and one scatter per tensor
            rows = src.view(src.shape[0], -1).index_select(0, src_index)
            dst.view(dst.shape[0], -1).index_copy_(0, dst_index, rows.to(dst.device))
        else:
            for s, d, n in runs:
                dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
    for tensor in (*sources[:1], *destinations[:1]):
        if tensor.device.type == "cuda":
            torch.cuda.synchronize(tensor.device)
