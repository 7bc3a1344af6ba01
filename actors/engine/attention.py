"""Attention over a paged KV cache (CPU and a portable CUDA path).

The cache of one layer is ``[num_blocks, block_size, kv_heads, head_dim]``; a sequence's
tokens live in the blocks of its block table (slot = block_id * block_size + offset). New
keys and values are written in place (``index_copy_`` at ``slot_mapping``); attention
copies each sequence's whole blocks out by block id. Decode rows are batched into one
SDPA call with a padding mask; a prefill chunk attends over its cached prefix plus
itself. A first chunk with no cached prefix attends straight to its own fresh keys,
skipping the gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class DecodeRows:
    """The first ``num_rows`` tokens of the batch: one new token per sequence."""

    num_rows: int
    block_tables: torch.Tensor  # [num_rows, max_blocks] long, padded with block 0
    mask: torch.Tensor  # [num_rows, 1, 1, max_blocks * block_size] bool, True where attended
    # Reused by every layer of the step: gathering into a preallocated buffer with
    # index_select is ~2.7x faster on a CPU than advanced indexing into a new tensor.
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

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
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] long
    decode: DecodeRows | None = None
    prefills: list[PrefillChunk] = field(default_factory=list)


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
) -> torch.Tensor:
    """Attention for every token of the step; q is ``[tokens, heads, dim]``."""
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    if meta.decode is not None:
        rows = meta.decode
        out[: rows.num_rows] = _decode_attention(q[: rows.num_rows], k_cache, v_cache, rows, scale)
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill_attention(q, k, v, k_cache, v_cache, chunk, scale)
    return out


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: DecodeRows, scale: float
) -> torch.Tensor:
    key_buffer, value_buffer = rows.buffers(k_cache)
    keys = gather_blocks(k_cache, rows.block_tables, key_buffer).transpose(1, 2)
    values = gather_blocks(v_cache, rows.block_tables, value_buffer).transpose(1, 2)
    attended = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=rows.mask, scale=scale, enable_gqa=True
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
) -> torch.Tensor:
    queries = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
    if chunk.block_table is None:
        keys = k[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        values = v[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        context = chunk.num_cached + chunk.end - chunk.start
        table = chunk.block_table.unsqueeze(0)
        keys = gather_blocks(k_cache, table)[:, :context].transpose(1, 2)
        values = gather_blocks(v_cache, table)[:, :context].transpose(1, 2)
        mask = _offset_causal_mask(chunk.end - chunk.start, chunk.num_cached, q.device)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return attended.squeeze(0).transpose(0, 1)


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


def _offset_causal_mask(num_new: int, num_cached: int, device: torch.device) -> torch.Tensor:
    """Query i (at position num_cached + i) sees keys 0 .. num_cached + i."""
    query_pos = torch.arange(num_new, device=device).unsqueeze(1) + num_cached
    key_pos = torch.arange(num_cached + num_new, device=device).unsqueeze(0)
    return key_pos <= query_pos
