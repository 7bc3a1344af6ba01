"""Runs one scheduled step through the model: inputs, KV slots, forward pass, sampling.

Token layout of a step: decoding sequences first (one token each, batched into a single
attention call), then each prefill chunk. Logits are computed only for rows that end a
sequence's pending tokens; a prefill chunk that stops mid-prompt samples nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynask.actors.engine.attention import AttentionMetadata, DecodeRows, PrefillChunk
from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.sampling import sample
from dynask.actors.engine.scheduler import ScheduledChunk
from dynask.actors.engine.sequence import Sequence


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype


class ModelRunner:
    """Owns the model and its KV cache tensors on one device."""

    def __init__(self, model: CausalLM, spec: KVCacheSpec, device: torch.device) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        shape = (spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeroed, not empty: padded decode rows read slot 0, and garbage (NaN) there would
        # poison the masked softmax.
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=spec.dtype, device=device),
                torch.zeros(shape, dtype=spec.dtype, device=device),
            )
            for _ in range(spec.num_layers)
        ]

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Computes the step; returns the sampled token per chunk (None: mid-prefill)."""
        ordered = sorted(range(len(chunks)), key=lambda i: not _is_decode(chunks[i]))
        batch = _StepInputs.build([chunks[i] for i in ordered], self.spec.block_size, self.device)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta)
        sampled_rows = [i for i in ordered if chunks[i].samples]
        if not sampled_rows:
            return [None] * len(chunks)
        row_index = torch.tensor(batch.last_rows(ordered, sampled_rows), device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, row_index))
        seqs = [chunks[i].seq for i in sampled_rows]
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        result: list[int | None] = [None] * len(chunks)
        for i, token in zip(sampled_rows, tokens, strict=True):
            result[i] = token
        return result

    def export_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """KV of the given blocks: ``[layers, 2, blocks, block_size, kv_heads, head_dim]``."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        per_layer = [torch.stack((k[ids], v[ids])) for k, v in self.kv_caches]
        return torch.stack(per_layer).cpu()

    def import_blocks(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Writes KV exported by ``export_blocks`` into the given blocks."""
        spec = self.spec
        expected = (
            spec.num_layers,
            2,
            len(block_ids),
            spec.block_size,
            spec.num_kv_heads,
            spec.head_dim,
        )
        if tuple(kv.shape) != expected:
            raise ValueError(f"KV tensor has shape {tuple(kv.shape)}; expected {expected}")
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        kv = kv.to(self.device, spec.dtype)
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            k_cache.index_copy_(0, ids, kv[layer, 0])
            v_cache.index_copy_(0, ids, kv[layer, 1])


def _is_decode(chunk: ScheduledChunk) -> bool:
    return chunk.num_new_tokens == 1 and chunk.seq.num_computed_tokens > 0


@dataclass
class _StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    ends: list[int]  # per ordered chunk: index of its last token row

    def last_rows(self, ordered: list[int], wanted: list[int]) -> list[int]:
        end_of = {chunk_index: self.ends[pos] for pos, chunk_index in enumerate(ordered)}
        return [end_of[i] for i in wanted]

    @classmethod
    def build(
        cls, chunks: list[ScheduledChunk], block_size: int, device: torch.device
    ) -> _StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        ends: list[int] = []
        decode_seqs: list[Sequence] = []
        prefills: list[PrefillChunk] = []
        for chunk in chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            stop = start + chunk.num_new_tokens
            ids += _token_slice(seq, start, stop)
            positions += range(start, stop)
            slots += [
                seq.blocks[p // block_size].block_id * block_size + p % block_size
                for p in range(start, stop)
            ]
            ends.append(len(ids) - 1)
            if _is_decode(chunk):
                decode_seqs.append(seq)
            else:
                table = _block_table([seq], block_size, stop, device)[0] if start else None
                prefills.append(
                    PrefillChunk(len(ids) - chunk.num_new_tokens, len(ids), start, table)
                )
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            decode=_decode_rows(decode_seqs, block_size, device) if decode_seqs else None,
            prefills=prefills,
        )
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            meta=meta,
            ends=ends,
        )


def _token_slice(seq: Sequence, start: int, stop: int) -> list[int]:
    prompt = seq.prompt_token_ids
    if start >= len(prompt):
        offset = len(prompt)
        return seq.output_token_ids[start - offset : stop - offset]
    return (prompt + seq.output_token_ids)[start:stop] if stop > len(prompt) else prompt[start:stop]


def _block_table(
    seqs: list[Sequence], block_size: int, width: int, device: torch.device
) -> torch.Tensor:
    """``[len(seqs), blocks]`` block ids covering positions 0 .. width-1 (0 as padding)."""
    num_blocks = -(-width // block_size)
    table = [[int(b.block_id) for b in s.blocks[:num_blocks]] for s in seqs]
    table = [row + [0] * (num_blocks - len(row)) for row in table]
    return torch.tensor(table, dtype=torch.long, device=device)


def _decode_rows(seqs: list[Sequence], block_size: int, device: torch.device) -> DecodeRows:
    lengths = [s.num_computed_tokens + 1 for s in seqs]
    table = _block_table(seqs, block_size, max(lengths), device)
    width = table.shape[1] * block_size
    mask = (
        torch.arange(width, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    )
    return DecodeRows(num_rows=len(seqs), block_tables=table, mask=mask[:, None, None, :])
