"""Runs one scheduled step through the model: inputs, KV slots, forward pass, sampling.

Token layout of a step: decoding sequences first (one token each, batched into a single
attention call), then each prefill chunk. Logits are computed only for rows that end a
sequence's pending tokens; a prefill chunk that stops mid-prompt samples nothing.

On CUDA the step's inputs come from ``cuda_step`` (paged kernels reading the cache in
place); a decode-only step replays a CUDA graph when graphs were captured
(``capture_decode_graphs``). The cache then has one extra scratch block past the pool's
blocks, where padded graph rows write. Sampling runs where the logits are and hands back
the token ids with one device-to-host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynask.actors.engine.attention import AttentionMetadata, DecodeRows, PrefillChunk
from dynask.actors.engine.cuda.step import CudaLayout, DecodeGraphs, build_cuda_inputs
from dynask.actors.engine.cuda.triton_attention import compile_paged_prefill
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
        self.graphs: DecodeGraphs | None = None
        self.cuda_layout: CudaLayout | None = None
        num_blocks = spec.num_blocks
        if device.type == "cuda":
            num_blocks += 1  # the scratch block for padded rows of a CUDA graph
            config = model.config
            self.cuda_layout = CudaLayout(
                block_size=spec.block_size,
                num_kv_heads=spec.num_kv_heads,
                group=config.num_heads // config.num_kv_heads,
                num_sms=torch.cuda.get_device_properties(device).multi_processor_count,
                scratch_slot=spec.num_blocks * spec.block_size,
            )
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeroed, not empty: padded decode rows read slot 0, and garbage (NaN) there would
        # poison the masked softmax.
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=spec.dtype, device=device),
                torch.zeros(shape, dtype=spec.dtype, device=device),
            )
            for _ in range(spec.num_layers)
        ]

    def compile_kernels(self) -> None:
        """Compiles the paged prefill kernel now (CUDA); decode kernels compile on capture."""
        if self.cuda_layout is not None:
            k_cache, v_cache = self.kv_caches[0]
            compile_paged_prefill(k_cache, v_cache, self.model.config.num_heads)

    def capture_decode_graphs(self, max_batch: int, max_model_len: int) -> None:
        """Captures decode steps of up to ``max_batch`` rows (CUDA only)."""
        if self.cuda_layout is None:
            raise ValueError(f"CUDA graphs need a CUDA device; this runner is on {self.device}")
        max_blocks = -(-max_model_len // self.spec.block_size)
        with torch.inference_mode():
            self.graphs = DecodeGraphs(
                self.model, self.kv_caches, self.cuda_layout, max_batch, max_blocks
            )

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Computes the step; returns the sampled token per chunk (None: mid-prefill)."""
        ordered = sorted(range(len(chunks)), key=lambda i: not _is_decode(chunks[i]))
        plan = _StepPlan.build([chunks[i] for i in ordered], self.spec.block_size)
        sampled_rows = [i for i in ordered if chunks[i].samples]
        logits = self._logits(plan, ordered, sampled_rows)
        if logits is None:
            return [None] * len(chunks)
        seqs = [chunks[i].seq for i in sampled_rows]
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        result: list[int | None] = [None] * len(chunks)
        for i, token in zip(sampled_rows, tokens, strict=True):
            result[i] = token
        return result

    @torch.inference_mode()
    def run_decode_burst(self, chunks: list[ScheduledChunk], steps: int) -> list[list[int]]:
        """Greedy tokens of ``steps`` decode steps of ``chunks``, one list per step.

        Step ``i`` feeds every row the token step ``i - 1`` chose, at the next position;
        the blocks for all ``steps`` tokens must be reserved (``decode_burst``). With CUDA
        graphs the steps are chained on the device and the host waits once.
        """
        seqs = [chunk.seq for chunk in chunks]
        block_size = self.spec.block_size
        starts = [seq.num_computed_tokens for seq in seqs]
        positions = [[start + i for start in starts] for i in range(steps)]
        slots = [
            [_slot(seq, position, block_size) for seq, position in zip(seqs, row, strict=True)]
            for row in positions
        ]
        tables = [
            [int(b.block_id) for b in seq.blocks[: -(-(start + steps) // block_size)]]
            for seq, start in zip(seqs, starts, strict=True)
        ]
        ids = [seq.token_ids()[-1] for seq in seqs]
        graphs = self.graphs
        if graphs is not None and graphs.bucket_for(len(seqs)):
            return graphs.replay_greedy_chain(ids, positions, slots, tables).tolist()  # type: ignore[no-any-return]
        results = []
        rows = list(range(len(seqs)))
        for step in range(steps):
            plan = _StepPlan([ids, positions[step], slots[step]], rows, seqs, tables, [])
            logits = self._logits(plan, rows, rows)
            assert logits is not None  # every row samples
            ids = [int(t) for t in logits.argmax(dim=-1).tolist()]
            results.append(ids)
        return results

    def _logits(
        self, plan: _StepPlan, ordered: list[int], sampled_rows: list[int]
    ) -> torch.Tensor | None:
        graphs = self.graphs
        decode_only = len(plan.decode_tables) == len(plan.ends)
        all_sample = len(sampled_rows) == len(ordered)
        if graphs is not None and decode_only and all_sample and graphs.bucket_for(len(ordered)):
            return graphs.replay(plan.tokens, plan.decode_tables)  # every row samples
        if self.cuda_layout is not None:
            inputs = build_cuda_inputs(
                plan.tokens, plan.decode_tables, plan.prefills, self.cuda_layout, self.device
            )
            input_ids, positions, meta = inputs.input_ids, inputs.positions, inputs.meta
        else:
            input_ids, positions, meta = plan.cpu_inputs(self.spec.block_size, self.device)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not sampled_rows:
            return None
        row_index = torch.tensor(plan.last_rows(ordered, sampled_rows)).to(self.device)
        return self.model.compute_logits(hidden.index_select(0, row_index))

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
class _StepPlan:
    """A step's rows as plain lists, before they become tensors on a device."""

    tokens: list[list[int]]  # [ids, positions, slots] per row
    ends: list[int]  # per ordered chunk: index of its last token row
    decode_seqs: list[Sequence]
    decode_tables: list[list[int]]  # block ids per decode row
    prefills: list[tuple[int, int, int, list[int]]]  # first row, new, cached, block ids

    def last_rows(self, ordered: list[int], wanted: list[int]) -> list[int]:
        end_of = {chunk_index: self.ends[pos] for pos, chunk_index in enumerate(ordered)}
        return [end_of[i] for i in wanted]

    @classmethod
    def build(cls, chunks: list[ScheduledChunk], block_size: int) -> _StepPlan:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        plan = cls([ids, positions, slots], [], [], [], [])
        for chunk in chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            stop = start + chunk.num_new_tokens
            ids += _token_slice(seq, start, stop)
            positions += range(start, stop)
            slots += [_slot(seq, p, block_size) for p in range(start, stop)]
            plan.ends.append(len(ids) - 1)
            blocks = [int(b.block_id) for b in seq.blocks[: -(-stop // block_size)]]
            if _is_decode(chunk):
                plan.decode_seqs.append(seq)
                plan.decode_tables.append(blocks)
            else:
                plan.prefills.append((len(ids) - chunk.num_new_tokens, stop - start, start, blocks))
        return plan

    def cpu_inputs(
        self, block_size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Input ids, positions and metadata for the gathering (CPU) attention path."""
        prefills = [
            PrefillChunk(
                first,
                first + count,
                cached,
                torch.tensor(blocks, dtype=torch.long, device=device) if cached else None,
            )
            for first, count, cached, blocks in self.prefills
        ]
        ids, positions, slots = (
            torch.tensor(t, dtype=torch.long, device=device) for t in self.tokens
        )
        decode = None
        if self.decode_seqs:
            rows = len(self.decode_tables)  # decode rows come first
            decode = _decode_rows(self.tokens[1][:rows], self.decode_tables, block_size, device)
        meta = AttentionMetadata(slot_mapping=slots, decode=decode, prefills=prefills)
        return ids, positions, meta


def _token_slice(seq: Sequence, start: int, stop: int) -> list[int]:
    prompt = seq.prompt_token_ids
    if start >= len(prompt):
        offset = len(prompt)
        return seq.output_token_ids[start - offset : stop - offset]
    return (prompt + seq.output_token_ids)[start:stop] if stop > len(prompt) else prompt[start:stop]


def _slot(seq: Sequence, position: int, block_size: int) -> int:
    return int(seq.blocks[position // block_size].block_id) * block_size + position % block_size


def _decode_rows(
    positions: list[int], tables: list[list[int]], block_size: int, device: torch.device
) -> DecodeRows:
    lengths = torch.tensor([position + 1 for position in positions], device=device)
    num_blocks = max(len(t) for t in tables)
    padded = [t + [0] * (num_blocks - len(t)) for t in tables]
    table = torch.tensor(padded, dtype=torch.long, device=device)
    mask = torch.arange(num_blocks * block_size, device=device)[None, :] < lengths[:, None]
    return DecodeRows(len(tables), table, mask[:, None, None, :], lengths)
