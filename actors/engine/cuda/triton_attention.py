"""Paged attention kernels for CUDA (Triton): queries read K/V blocks in place.

Design decisions:

* One tile of a program is ``BLOCK_M`` rows = query tokens x the query heads of one KV
  head (GQA group), so each K/V load is shared by the whole group. Row ``r`` is token
  ``r // group`` and head ``r % group``; a group of 3 or 5 heads works too.
* Keys are fetched ``BLOCK_N`` tokens at a time straight from the cache
  ``[num_blocks, block_size, kv_heads, head_dim]`` through the block table (slot =
  block_id * block_size + offset), whatever the block size; nothing is gathered into a
  contiguous copy. The loop stops at the last query's position (causal), so a prefill
  tile with a cached prefix reads exactly the keys it needs.
* Decode (one token per sequence) splits each sequence's context over ``num_splits``
  programs (flash-decoding) when the batch alone cannot fill the GPU, then merges the
  partial softmaxes in a second small kernel. The split count is fixed per call, so a
  CUDA graph captured for a batch size keeps it.
* Fast path (``EngineConfig.cuda_fast_paths``, on by default since 2026-12-01): prefill
  tiles split their keys the same way when the tiles alone leave most of the GPU idle
  (``prefill_splits``): a prompt whose prefix is cached recomputes one block after
  thousands of cached keys, one tile per KV head (8 programs for Llama-3.1-8B, each
  walking every key) unless split. ``paged_prefill_split`` launches
  ``triton_prefill_split``'s kernel (the split count a runtime argument: one compile for
  every count) and its merge; ``paged_prefill`` launches the kernel of before, unchanged.
* Sliding windows (Mistral, windowed Qwen2 layers) are a compile-time ``WINDOW``: a query
  at position p sees keys p - WINDOW + 1 .. p; decode rows and prefill tiles start their
  key loop at the first visible key, so a window also bounds the KV read.
* A decode row with ``seq_len == 0`` is padding (CUDA-graph buckets): it is skipped and
  its output row left unwritten.
* float32 caches use exact (IEEE) dot products; bf16/fp16 accumulate in float32 and feed
  the P·V product in the cache dtype, as flash attention does.

Triton is imported lazily (``load_kernels`` → ``triton_kernels``,
``load_split_prefill_kernels`` → ``triton_prefill_split``): the CPU install does not need
it, and an engine with the fast paths off never compiles the split kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from dynask.actors.engine.cuda import pdl
from dynask.kv.block import ceil_div

LOG2E = 1.4426950408889634
DECODE_BLOCK_N = 64
PREFILL_BLOCK_M = 64
PREFILL_BLOCK_N = 64
MAX_PREFILL_SPLITS = 16


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def load_kernels() -> Any:
    """The kernel module, compiled on first use; raises ImportError without Triton."""
    return importlib.import_module("dynask.actors.engine.cuda.triton_kernels")


def load_split_prefill_kernels() -> Any:
    """The split prefill kernels, compiled on first use (ImportError without Triton)."""
    return importlib.import_module("dynask.actors.engine.cuda.triton_prefill_split")


def decode_splits(num_rows: int, num_kv_heads: int, num_sms: int) -> int:
    """Context splits per decode row: enough programs for about two waves of the GPU."""
    wanted = ceil_div(2 * num_sms, max(1, num_rows * num_kv_heads))
    return min(16, next_power_of_2(wanted)) if wanted > 1 else 1


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    window: int | None = None,
) -> None:
    """Writes attention of ``q [rows, heads, dim]`` (one token per row) into ``out``.

    ``q`` may be a view with any row stride (a slice of the fused qkv output); its heads
    and dims must be dense. ``out`` is contiguous. ``window``: a sliding window (each row
    sees its last ``window`` positions; None: the whole context).
    """
    kernels = load_kernels()
    rows, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    ieee = q.dtype == torch.float32
    common = {
        "NUM_HEADS": num_heads,
        "HEAD_DIM": head_dim,
    }
    part_acc = part_ml = out  # unused placeholders when not split
    if num_splits > 1:
        part_acc = torch.empty(
            (rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_ml = torch.empty(
            (rows, num_heads, num_splits, 2), dtype=torch.float32, device=q.device
        )
    kernels.decode_kernel[(rows, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        out,
        part_acc,
        part_ml,
        block_tables,
        seq_lens,
        q.stride(0),
        block_tables.stride(0),
        scale * LOG2E,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_M=max(16, next_power_of_2(group)),
        BLOCK_N=DECODE_BLOCK_N,
        NUM_SPLITS=num_splits,
        IEEE=ieee,
        WINDOW=window or 0,
        num_warps=4,
        num_stages=3,
        **common,
        **pdl.options(q.device),
    )
    if num_splits > 1:
        kernels.merge_kernel[(rows, num_heads)](
            out, part_acc, part_ml, seq_lens, NUM_SPLITS=num_splits, num_warps=1, **common,
            **pdl.options(q.device),
        )  # fmt: skip


def prefill_tiles(
    chunk_rows: list[tuple[int, int, int]],
    group: int,
    device: torch.device,
    pinned: bool = False,
) -> torch.Tensor:
    """``[4, tiles]`` int32 (chunk, first query row, query count, first position).

    ``chunk_rows`` holds per prefill chunk (first row in q, token count, cached tokens).
    ``pinned`` (with the split kernels, CUDA): the host tensor is pinned, since a
    pageable copy waits for the work on the stream (a decode step in flight).
    """
    per_tile = max(1, PREFILL_BLOCK_M // group)
    columns: list[tuple[int, int, int, int]] = []
    for chunk, (start, count, cached) in enumerate(chunk_rows):
        for offset in range(0, count, per_tile):
            columns.append((chunk, start + offset, min(per_tile, count - offset), cached + offset))
    host = torch.tensor(columns, dtype=torch.int32).t().contiguous()
    if pinned and device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def num_prefill_tiles(chunk_rows: list[tuple[int, int, int]], group: int) -> int:
    """How many tiles ``prefill_tiles`` makes of these chunks."""
    per_tile = max(1, PREFILL_BLOCK_M // group)
    return sum(ceil_div(count, per_tile) for _, count, _ in chunk_rows)


def prefill_splits(num_tiles: int, num_kv_heads: int, num_sms: int, max_keys: int) -> int:
    """Key splits per prefill tile (fast paths): one unless the tiles leave most of the GPU idle.

    A short chunk after a long cached prefix (a prompt whose prefix is cached recomputes
    its last block: 16 tokens after 4,080 on a 4,096-token prompt) is one tile per KV head,
    8 programs for Llama-3.1-8B, each walking every key; splitting the keys over programs
    (as flash-decoding does for decode rows) fills about two waves of the GPU, each split
    keeping at least two key tiles of its own.
    """
    programs = max(1, num_tiles * num_kv_heads)
    wanted = ceil_div(2 * num_sms, programs)
    most = max_keys // (2 * PREFILL_BLOCK_N)
    if wanted <= 1 or most <= 1:
        return 1
    splits = min(MAX_PREFILL_SPLITS, next_power_of_2(wanted))
    while splits > most:
        splits //= 2
    return max(1, splits)


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    tiles: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> None:
    """Causal attention of prefill chunks over their cached prefix plus themselves (with
    a sliding ``window``: over the last ``window`` positions of each query)."""
    kernels = load_kernels()
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_m = PREFILL_BLOCK_M if group <= PREFILL_BLOCK_M else next_power_of_2(group)
    num_tiles = tiles.shape[1]
    kernels.prefill_kernel[(num_tiles, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        tiles,
        num_tiles,
        q.stride(0),
        block_tables.stride(0),
        scale * LOG2E,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=PREFILL_BLOCK_N,
        IEEE=q.dtype == torch.float32,
        WINDOW=window or 0,
        num_warps=4,
        num_stages=2,
    )


def paged_prefill_split(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    tiles: torch.Tensor,
    scale: float,
    window: int | None,
    num_splits: int,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """``paged_prefill`` with each tile's keys shared out over ``num_splits`` (>= 2)
    programs, their partial softmaxes merged by a second kernel (the fast paths);
    ``partials`` (``prefill_partials``) is their scratch, made here when not given."""
    if num_splits < 2:
        raise ValueError(f"paged_prefill_split 'num_splits' has value {num_splits}; expected >= 2")
    kernels = load_split_prefill_kernels()
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_m = prefill_block_m(group)
    num_tiles = tiles.shape[1]
    part_acc, part_ml = partials or prefill_partials(
        num_tiles, num_kv_heads, num_splits, block_m, head_dim, q.device
    )
    kernels.split_prefill_kernel[(num_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, part_acc, part_ml, block_tables, tiles, num_tiles, q.stride(0),
        block_tables.stride(0), scale * LOG2E, num_splits, NUM_KV_HEADS=num_kv_heads,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=block_m,
        BLOCK_N=PREFILL_BLOCK_N, IEEE=q.dtype == torch.float32, WINDOW=window or 0,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    kernels.prefill_merge_kernel[(num_tiles, num_kv_heads)](
        out, part_acc, part_ml, tiles, num_tiles, num_splits, NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m,
        num_warps=4,
    )  # fmt: skip


def prefill_block_m(group: int) -> int:
    return PREFILL_BLOCK_M if group <= PREFILL_BLOCK_M else next_power_of_2(group)


def prefill_partials(
    num_tiles: int,
    num_kv_heads: int,
    num_splits: int,
    block_m: int,
    head_dim: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch of a split prefill launch: float32 (acc ``[.., head_dim]``, (m, l) pairs)."""
    rows = num_tiles * num_kv_heads * num_splits * block_m
    acc = torch.empty((rows, head_dim), dtype=torch.float32, device=device)
    return acc, torch.empty((rows, 2), dtype=torch.float32, device=device)


def compile_paged_prefill(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> None:
    """Runs the prefill kernel once on a one-token chunk, so that it compiles at start-up.

    Otherwise the first step that continues a cached prefix pays the compile (~0.7 s on
    an H200) in the middle of serving. Reads block 0 and writes a scratch output only.
    """
    device = k_cache.device
    q = torch.zeros((1, num_heads, k_cache.shape[3]), dtype=k_cache.dtype, device=device)
    tables = torch.zeros((1, 1), dtype=torch.int32, device=device)
    tiles = prefill_tiles([(0, 1, 0)], num_heads // k_cache.shape[2], device)
    paged_prefill(q, k_cache, v_cache, torch.empty_like(q), tables, tiles, 1.0)


def compile_split_prefill(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> None:
    """``compile_paged_prefill`` for the split kernel and its merge (two splits, the
    second with no key)."""
    device = k_cache.device
    q = torch.zeros((1, num_heads, k_cache.shape[3]), dtype=k_cache.dtype, device=device)
    tables = torch.zeros((1, 1), dtype=torch.int32, device=device)
    tiles = prefill_tiles([(0, 1, 0)], num_heads // k_cache.shape[2], device, pinned=True)
    paged_prefill_split(q, k_cache, v_cache, torch.empty_like(q), tables, tiles, 1.0, None, 2)
