"""Attention over a paged KV cache: a CPU path and an in-place CUDA path.

The cache of one layer is ``[num_blocks, block_size, kv_heads, head_dim]``; a sequence's
tokens live in the blocks of its block table (slot = block_id * block_size + offset). New
keys and values are written in place (``index_copy_`` at ``slot_mapping``).

CPU: attention copies each sequence's whole blocks out by block id (fast there). Decode
rows are batched into one SDPA call with a padding mask; a prefill chunk attends over its
cached prefix plus itself.

CUDA (``PagedDecode`` / ``PagedPrefill`` in the metadata): Triton kernels read the
blocks in place (``triton_attention``); all decode rows are one launch, all prefill
chunks with a cached prefix another. Its tensors are int32 and fixed-shape per batch
size, so a decode step can be captured in a CUDA graph and replayed.

Both: a chunk with no cached prefix attends straight to its own fresh keys with SDPA
(flash attention on a GPU), skipping the cache. With ``AttentionMetadata.cuda_fast_paths``
(set by the CUDA step builder from ``EngineConfig.cuda_fast_paths``, on by default; never on
a CPU) a long bf16/fp16 chunk goes to cuDNN's SDPA, and a chunk that is the step's only
work returns its SDPA output as the step's (no copy).

Sliding windows (Mistral, windowed Qwen2 layers): a layer's ``window`` W lets a token see
the last W positions, itself included, as transformers does. The CPU path masks the rest
out; the CUDA kernels take W as a compile-time constant and start each key loop at the
first visible key; a fresh chunk longer than W goes to SDPA with a windowed mask.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from dynask.actors.engine.cuda import triton_attention


@dataclass
class DecodeRows:
    """The first ``num_rows`` tokens of the batch: one new token per sequence."""

    num_rows: int
    block_tables: torch.Tensor  # [num_rows, max_blocks] long, padded with block 0
    mask: torch.Tensor  # [num_rows, 1, 1, max_blocks * block_size] bool, True where attended
    lengths: torch.Tensor | None = None  # [num_rows] context length incl. the new token
    # Reused by every layer of the step: gathering into a preallocated buffer with
    # index_select is ~2.7x faster on a CPU than advanced indexing into a new tensor.
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask_for(self, window: int | None) -> torch.Tensor:
        """``mask`` narrowed to each row's last ``window`` positions (made once a step)."""
        if window is None or self.lengths is None:
            return self.mask
        if window not in self._window_masks:
            key_pos = torch.arange(self.mask.shape[-1], device=self.mask.device)
            recent = key_pos[None, :] >= (self.lengths - window)[:, None]
            self._window_masks[window] = self.mask & recent[:, None, None, :]
        return self._window_masks[window]

    def buffers(self, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._buffers is None:
            shape = (self.block_tables.numel(), *cache.shape[1:])
            self._buffers = (
                torch.empty(shape, dtype=cache.dtype, device=cache.device),
                torch.empty(shape, dtype=cache.dtype, device=cache.device),
            )
        return self._buffers


@dataclass
class PrefillChunk:
    """A run of new tokens ``[start, end)`` of one sequence, after ``num_cached`` tokens."""

    start: int
    end: int
    num_cached: int
    block_table: torch.Tensor | None  # [blocks] long; None when num_cached == 0


@dataclass
class PagedDecode:
    """CUDA: the first ``block_tables.shape[0]`` tokens decode, reading blocks in place."""

    block_tables: torch.Tensor  # [rows, max_blocks] int32
    seq_lens: torch.Tensor  # [rows] int32, context length incl. the new token; 0 = padding
    num_splits: int  # context splits per row (flash-decoding), fixed per batch size


@dataclass
class PagedPrefill:
    """CUDA: every prefill chunk with a cached prefix, in one kernel launch."""

    block_tables: torch.Tensor  # [chunks, max_blocks] int32
    tiles: torch.Tensor  # [4, tiles] int32, see triton_attention.prefill_tiles
    # Key splits per tile (triton_attention.prefill_splits); > 1 only with the
    # split kernel (EngineConfig.cuda_fast_paths), 1: the kernel of before.
    num_splits: int = 1
    # The split launch's scratch, made by the first layer and reused by the others (one
    # stream: a layer's merge has read it before the next layer's kernel writes it).
    _partials: tuple[torch.Tensor, torch.Tensor] | None = None

    def partials(self, q: torch.Tensor, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._partials is None:
            group = q.shape[1] // num_kv_heads
            self._partials = triton_attention.prefill_partials(
                self.tiles.shape[1],
                num_kv_heads,
                self.num_splits,
                triton_attention.prefill_block_m(group),
                q.shape[2],
                q.device,
            )
        return self._partials


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] long
    decode: DecodeRows | None = None
    prefills: list[PrefillChunk] = field(default_factory=list)  # CUDA: uncached ones only
    paged_decode: PagedDecode | None = None
    paged_prefill: PagedPrefill | None = None
    # CUDA only (build_cuda_inputs sets it from EngineConfig.cuda_fast_paths; False on a
    # CPU): cuDNN for a long lone chunk, a lone chunk's SDPA output returned uncopied.
    cuda_fast_paths: bool = False


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Stores this step's keys and values into their slots."""
    k_cache.flatten(0, 1).index_copy_(0, slots, k)
    v_cache.flatten(0, 1).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    store_kv: bool = True,
    window: int | None = None,
) -> torch.Tensor:
    """Attention for every token of the step; q is ``[tokens, heads, dim]``.

    ``store_kv=False``: the caller already wrote k and v into the cache (fused RoPE).
    ``window``: this layer's sliding window (None: full attention).
    """
    if store_kv:
        write_kv(k_cache, v_cache, k.to(k_cache.dtype), v.to(v_cache.dtype), meta.slot_mapping)
    fast = meta.cuda_fast_paths
    if fast and q.device.type == "cuda" and _one_chunk_only(meta, q.shape[0]):
        # A lone prompt chunk (CUDA keeps q and the cache in one dtype): SDPA's output is
        # the step's, no copy into a fresh tensor.
        chunk = meta.prefills[0]
        return _prefill_attention(q, k, v, k_cache, v_cache, chunk, scale, window, cudnn=True)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if meta.paged_decode is not None:
        paged = meta.paged_decode
        num_rows = paged.block_tables.shape[0]
        triton_attention.paged_decode(
            q[:num_rows],
            k_cache,
            v_cache,
            out[:num_rows],
            paged.block_tables,
            paged.seq_lens,
            scale,
            paged.num_splits,
            window,
        )
    if meta.paged_prefill is not None:
        chunks = meta.paged_prefill
        if chunks.num_splits > 1:  # fast paths: the split kernel and its merge
            triton_attention.paged_prefill_split(
                q, k_cache, v_cache, out, chunks.block_tables, chunks.tiles, scale, window,
                chunks.num_splits, chunks.partials(q, k_cache.shape[2]),
            )  # fmt: skip
        else:
            triton_attention.paged_prefill(
                q, k_cache, v_cache, out, chunks.block_tables, chunks.tiles, scale, window
            )
    if k_cache.dtype != q.dtype:  # a float32 cache under bf16 weights, on a CPU
        q, k, v = q.to(k_cache.dtype), k.to(k_cache.dtype), v.to(k_cache.dtype)
    if meta.decode is not None:
        rows = meta.decode
        out[: rows.num_rows] = _decode_attention(
            q[: rows.num_rows], k_cache, v_cache, rows, scale, window
        )
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill_attention(
            q, k, v, k_cache, v_cache, chunk, scale, window, cudnn=fast
        )
    return out


def _one_chunk_only(meta: AttentionMetadata, num_tokens: int) -> bool:
    """Whether the step is one prefill chunk covering every token, attended by SDPA."""
    others = (meta.decode, meta.paged_decode, meta.paged_prefill)
    if any(part is not None for part in others) or len(meta.prefills) != 1:
        return False
    chunk = meta.prefills[0]
    return chunk.block_table is None and chunk.start == 0 and chunk.end == num_tokens


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: DecodeRows,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    key_buffer, value_buffer = rows.buffers(k_cache)
    keys = gather_blocks(k_cache, rows.block_tables, key_buffer).transpose(1, 2)
    values = gather_blocks(v_cache, rows.block_tables, value_buffer).transpose(1, 2)
    attended = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=rows.mask_for(window), scale=scale, enable_gqa=True
    )
    return attended.squeeze(2)


def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
    window: int | None,
    cudnn: bool = False,
) -> torch.Tensor:
    """``cudnn``: a long fresh bf16/fp16 chunk may take cuDNN's SDPA (fast paths)."""
    queries = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
    num_new = chunk.end - chunk.start
    if window is not None and chunk.num_cached + num_new <= window:
        window = None  # nothing this chunk sees lies outside the window
    if chunk.block_table is None:
        keys = k[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        values = v[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        if window is not None:
            mask = _offset_causal_mask(num_new, 0, q.device, window)
            attended = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
            return attended.squeeze(0).transpose(0, 1)
        with _fresh_chunk_backends(q.device, num_new, q.dtype, cudnn):
            attended = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
    else:
        context = chunk.num_cached + chunk.end - chunk.start
        table = chunk.block_table.unsqueeze(0)
        keys = gather_blocks(k_cache, table)[:, :context].transpose(1, 2)
        values = gather_blocks(v_cache, table)[:, :context].transpose(1, 2)
        mask = _offset_causal_mask(num_new, chunk.num_cached, q.device, window)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return attended.squeeze(0).transpose(0, 1)


def _fresh_chunk_backends(
    device: torch.device, num_tokens: int, dtype: torch.dtype, cudnn: bool = False
) -> AbstractContextManager[None]:
    """On CUDA: flash attention (else efficient/math); with ``cudnn`` (the fast paths)
    cuDNN first for a long bf16/fp16 chunk.

    cuDNN's SDPA builds an execution plan per new shape and stride, ~0.8 ms of CPU per
    call; chunks of ever-new lengths at ever-new offsets in the step's q made mixed steps
    of a 64-prompt batch take 0.9 s instead of 0.2 s on an H200. A chunk of
    ``CUDNN_MIN_TOKENS`` or more pays that once per step (the layers share the plan) for
    a faster kernel on Hopper (PyTorch's own default there since cuDNN 9.15.1, which
    fixed lengths not a multiple of 128); with an older cuDNN it stays on flash.
    """
    if device.type != "cuda":
        return nullcontext()
    if (
        cudnn
        and num_tokens >= CUDNN_MIN_TOKENS
        and dtype in (torch.bfloat16, torch.float16)
        and _cudnn_ok()
    ):
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, *_GPU_SDPA_BACKENDS])
    return sdpa_kernel(_GPU_SDPA_BACKENDS)


_GPU_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
CUDNN_MIN_TOKENS = 1024
_CUDNN_FIXED = 91501  # cuDNN 9.15.1


@cache
def _cudnn_ok() -> bool:
    cudnn: Any = torch.backends.cudnn
    version = cudnn.version() if cudnn.is_available() else None
    return version is not None and version >= _CUDNN_FIXED


def gather_blocks(
    cache: torch.Tensor, block_tables: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``[rows, blocks * block_size, kv_heads, dim]``: whole blocks copied by block id.

    Copying whole blocks (a few KiB each) instead of single slots makes the copy several
    times faster on a CPU.
    """
    rows, blocks = block_tables.shape
    gathered = torch.index_select(cache, 0, block_tables.flatten(), out=out)
    return gathered.view(rows, blocks * cache.shape[1], *cache.shape[2:])


def _offset_causal_mask(
    num_new: int, num_cached: int, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """Query i (at position num_cached + i) sees keys 0 .. num_cached + i (the last
    ``window`` of them with a sliding window)."""
    query_pos = torch.arange(num_new, device=device).unsqueeze(1) + num_cached
    key_pos = torch.arange(num_cached + num_new, device=device).unsqueeze(0)
    mask = key_pos <= query_pos
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask
