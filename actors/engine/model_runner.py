"""Runs one scheduled step through the model: inputs, KV slots, forward pass, sampling.

Token layout of a step: decoding sequences first (one token each, batched into a single
attention call), then each prefill chunk. Logits are computed only for rows that end a
sequence's pending tokens; a prefill chunk that stops mid-prompt samples nothing.

On CUDA the step's inputs come from ``cuda_step`` (paged kernels reading the cache in
place); a decode-only step replays a CUDA graph when graphs were captured
(``capture_decode_graphs``), and with ``cuda_fast_paths`` (the default) so does a cached
prompt's short last chunk (``cuda.prefill_graph``).
The cache then has one extra scratch block past the pool's blocks, where padded graph
rows write. Sampling runs where the logits are and hands back
the token ids with one device-to-host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynask.actors.engine.cuda import gated_gemm
from dynask.actors.engine.cuda.overlap import PendingTokens
from dynask.actors.engine.cuda.prefill_graph import ShortPrefillGraph
from dynask.actors.engine.cuda.step import CudaLayout, DecodeGraphs, build_cuda_inputs
from dynask.actors.engine.cuda.triton_attention import compile_paged_prefill, compile_split_prefill
from dynask.actors.engine.grammar.structured_output import LogitsMask, advance_grammars
from dynask.actors.engine.logits.logprobs import compute_logprobs
from dynask.actors.engine.logits.processing import process_logits
from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.sampling import draw_generator, sample, sample_tensor
from dynask.actors.engine.scheduler import ScheduledChunk
from dynask.actors.engine.sequence import Sequence
from dynask.actors.engine.step_plan import StepPlan, StepRows, block_ids, is_decode, slot_of
from dynask.kv.block import ceil_div


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype


class ModelRunner:
    """Owns the model and its KV cache tensors on one device.

    ``cuda_fast_paths`` (``EngineConfig``'s, on by default) turns on the skinny fused
    projections, the prefill key splits, cuDNN for long lone chunks and the short-prefill
    graph; off, the kernels and paths of before. It is read on a CUDA device only: a CPU
    runner has no ``CudaLayout`` and never calls ``use_skinny_projections``.
    """

    def __init__(
        self,
        model: CausalLM,
        spec: KVCacheSpec,
        device: torch.device,
        eos_token_ids: tuple[int, ...] = (),  # what ``min_tokens`` masks
        cuda_fast_paths: bool = True,
    ) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.graphs: DecodeGraphs | None = None
        self.short_prefill: ShortPrefillGraph | None = None  # a cached prompt's last block
        self.grammar_mask = LogitsMask(model.config.vocab_size)  # structured outputs
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
                fast_paths=cuda_fast_paths,
            )
            if cuda_fast_paths:
                model.use_skinny_projections()
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

    def compile_kernels(self, max_rows: int) -> None:
        """Compiles the paged prefill kernel now (CUDA; with the fast paths the split one
        too, and the fused gate|up GEMM is timed for steps of up to ``max_rows`` rows);
        decode kernels compile on capture."""
        if self.cuda_layout is not None:
            k_cache, v_cache = self.kv_caches[0]
            compile_paged_prefill(k_cache, v_cache, self.model.config.num_heads)
            if self.cuda_layout.fast_paths:
                compile_split_prefill(k_cache, v_cache, self.model.config.num_heads)
                with torch.inference_mode():
                    gated_gemm.decide(self.model.gate_up_proj(0), max_rows)

    def capture_decode_graphs(self, max_batch: int, max_model_len: int) -> None:
        """Captures decode steps of up to ``max_batch`` rows (CUDA only); with the fast
        paths, the short prefill step of a cached prompt's last block too."""
        if self.cuda_layout is None:
            raise ValueError(f"CUDA graphs need a CUDA device; this runner is on {self.device}")
        max_blocks = ceil_div(max_model_len, self.spec.block_size)
        with torch.inference_mode():
            self.graphs = DecodeGraphs(
                self.model, self.kv_caches, self.cuda_layout, max_batch, max_blocks
            )
            if self.cuda_layout.fast_paths:
                self.short_prefill = self._capture_short_prefill(max_blocks)

    def _capture_short_prefill(self, max_blocks: int) -> ShortPrefillGraph:
        layout = self.cuda_layout
        assert layout is not None
        return ShortPrefillGraph(
            self.model,
            self.kv_caches,
            layout.group,
            layout.scratch_slot,
            max_blocks,
            torch.cuda.graph_pool_handle(),
        )

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        """Computes the step; returns the sampled token per chunk (None: mid-prefill)."""
        ordered = sorted(range(len(chunks)), key=lambda i: not is_decode(chunks[i]))
        plan = StepPlan.build([chunks[i] for i in ordered], self.spec.block_size)
        sampled_rows = [i for i in ordered if chunks[i].samples]
        logits = self._logits(plan, ordered, sampled_rows)
        if logits is None:
            return [None] * len(chunks)
        seqs = [chunks[i].seq for i in sampled_rows]
        params = [s.params for s in seqs]
        logits = process_logits(logits, seqs, self.eos_token_ids)
        self.grammar_mask.mask_logits(logits, seqs)  # after the biases: a masked token stays out
        tokens = sample(logits, params, [s.next_draw() for s in seqs])
        advance_grammars(seqs, tokens)
        for seq, logprob in zip(seqs, compute_logprobs(logits, params, tokens), strict=True):
            if logprob is not None:
                seq.logprobs.append(logprob)
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
            [slot_of(seq, position, block_size) for seq, position in zip(seqs, row, strict=True)]
            for row in positions
        ]
        tables = [
            block_ids(seq, start + steps, block_size)
            for seq, start in zip(seqs, starts, strict=True)
        ]
        ids = [seq.token_ids()[-1] for seq in seqs]
        graphs = self.graphs
        if graphs is not None and graphs.bucket_for(len(seqs)):
            return graphs.replay_greedy_chain(ids, positions, slots, tables).tolist()  # type: ignore[no-any-return]
        results = []
        rows = list(range(len(seqs)))
        for step in range(steps):
            plan = StepPlan.decode(seqs, StepRows(ids, positions[step], slots[step]), tables)
            logits = self._logits(plan, rows, rows)
            assert logits is not None  # every row samples
            ids = [int(t) for t in logits.argmax(dim=-1).tolist()]
            results.append(ids)
        return results

    @torch.inference_mode()
    def launch_step(self, chunks: list[ScheduledChunk]) -> tuple[PendingTokens, list[int]]:
        """Launches a scheduled step (prefill chunks, decode rows beside them) and returns its
        sampled ids, not waiting for them, with the index in ``chunks`` of each id's chunk.

        Every row's logits must need nothing on the host (``cuda.overlap.overlaps``) and at
        least one chunk must sample. On CUDA the eager forward pass is queued behind the
        work already on the stream and nothing here waits for the GPU.
        """
        ordered = sorted(range(len(chunks)), key=lambda i: not is_decode(chunks[i]))
        plan = StepPlan.build([chunks[i] for i in ordered], self.spec.block_size)
        sampled_rows = [i for i in ordered if chunks[i].samples]
        logits = self._logits(plan, ordered, sampled_rows)
        assert logits is not None  # a chunk samples
        seqs = [chunks[i].seq for i in sampled_rows]
        params = [seq.params for seq in seqs]
        if all(p.greedy for p in params):
            return PendingTokens(logits.argmax(dim=-1)), sampled_rows
        draws = [seq.next_draw() for seq in seqs]
        return PendingTokens(sample_tensor(logits, params, draws)), sampled_rows

    @torch.inference_mode()
    def launch_decode(
        self,
        seqs: list[Sequence],
        previous: PendingTokens | None,
        rows: list[int],
        in_flight: list[int] | None = None,
    ) -> PendingTokens:
        """Launches a decode step of ``seqs`` and returns its sampled ids, not waiting for them
        (asynchronous scheduling, ``cuda.overlap``).

        Without ``previous`` each row's input is its sequence's last token. With it, the
        input is the token ``previous`` sampled at ``rows[i]``, which the host has not
        applied yet: the row sits ``in_flight[i]`` positions further on (the tokens the
        step in flight computes for it: 1 for a decode row, a prefill chunk's length; 1
        each by default), in a slot already reserved.
        With a CUDA graph for the batch nothing here waits for the GPU; otherwise (the CPU)
        the step runs eagerly, after reading ``previous``.
        """
        ahead = [0] * len(seqs) if previous is None else in_flight or [1] * len(seqs)
        block_size = self.spec.block_size
        positions = [seq.num_computed_tokens + n for seq, n in zip(seqs, ahead, strict=True)]
        slots = [slot_of(seq, p, block_size) for seq, p in zip(seqs, positions, strict=True)]
        tables = [block_ids(seq, p + 1, block_size) for seq, p in zip(seqs, positions, strict=True)]
        graphs = self.graphs
        ids: list[int] | torch.Tensor
        if previous is None:
            ids = [_last_token(seq) for seq in seqs]
        elif graphs is not None and graphs.bucket_for(len(seqs)):
            ids = previous.device_tokens
            if rows != list(range(len(ids))):
                picked = torch.tensor(rows).pin_memory().to(ids.device, non_blocking=True)
                ids = ids[picked]  # a plain .to() of a pageable list would wait for the GPU
        else:
            earlier = previous.tokens()
            ids = [earlier[row] for row in rows]
        if graphs is not None and graphs.bucket_for(len(seqs)):
            logits = graphs.launch(ids, positions, slots, tables)
        else:
            assert isinstance(ids, list)
            plan = StepPlan.decode(seqs, StepRows(ids, positions, slots), tables)
            every = list(range(len(seqs)))
            step_logits = self._logits(plan, every, every)
            assert step_logits is not None  # every row samples
            logits = step_logits
        params = [seq.params for seq in seqs]
        if all(p.greedy for p in params):
            return PendingTokens(logits.argmax(dim=-1))
        # The draw for the token at position p + 1 (``Sequence.next_draw`` once applied).
        draws = [
            draw_generator(seq.generator, seq.seed, p + 1)
            for seq, p in zip(seqs, positions, strict=True)
        ]
        return PendingTokens(sample_tensor(logits, params, draws))

    def _logits(
        self, plan: StepPlan, ordered: list[int], sampled_rows: list[int]
    ) -> torch.Tensor | None:
        graphs = self.graphs
        all_sample = len(sampled_rows) == len(ordered)
        if (
            graphs is not None
            and plan.decode_only
            and all_sample
            and graphs.bucket_for(len(ordered))
        ):
            return graphs.replay(plan.rows, plan.decode_tables)  # every row samples
        short = self.short_prefill  # None unless the fast paths are on
        if short is not None and short.fits(plan, all_sample):
            return short.replay(plan)
        if self.cuda_layout is not None:
            inputs = build_cuda_inputs(plan, self.cuda_layout, self.device)
            input_ids, positions, meta = inputs.input_ids, inputs.positions, inputs.meta
        else:
            input_ids, positions, meta = plan.cpu_inputs(self.spec.block_size, self.device)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not sampled_rows:
            return None
        rows = torch.tensor(plan.last_rows(ordered, sampled_rows))
        if self.cuda_layout is not None:  # a pageable copy would wait for the forward pass
            rows = rows.pin_memory()
        row_index = rows.to(self.device, non_blocking=True)
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


def _last_token(seq: Sequence) -> int:
    return seq.output_token_ids[-1] if seq.output_token_ids else seq.prompt_token_ids[-1]
