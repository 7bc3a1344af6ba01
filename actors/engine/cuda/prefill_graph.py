"""A short prefill chunk after a cached prefix, replayed from a CUDA graph.

A prompt whose prefix is in the cache recomputes only its last block: a step of one
chunk of a few tokens (16 for a 4,096-token prompt) whose GPU work is the weights' read
(~4 ms for an 8B model in bf16). Run eagerly, that step launches ~10 kernels a layer from
Python, 0.1-0.25 ms of host time a layer, so its TTFT followed the host: 12 ms on some
H200 machines, 16-22 ms on others (issue 19). Captured once at start-up, it costs one
replay.

Design decisions:

* One graph, for a step that is exactly one prefill chunk of ``2 .. max_tokens`` new
  tokens (one prefill tile: 16 for a GQA group of 4) after a cached prefix, that samples
  (it ends the prompt). One new token is a decode row (``step_plan.is_decode``) and
  replays a decode graph; anything else stays eager.
* Rows past the chunk's ``n`` tokens are padding: token 0, position 0, KV slot in the
  scratch block. The tile's query count is ``n``, so the attention kernel neither reads
  their queries nor writes their outputs; every other op is row-wise, so their rows stay
  apart from the chunk's, and only row ``n - 1``'s logits are computed.
* The attention launch always splits the keys ``MAX_PREFILL_SPLITS`` ways (a split with
  no keys leaves m = -inf, which the merge skips), so one grid serves every context; its
  scratch is made in the warm-up run, before the capture, and lives with the graph.
* The block table row is as wide as ``max_model_len``'s blocks; a replay writes only the
  blocks its chunk covers (the kernel reads none past them).
"""

from __future__ import annotations

from typing import Any

import torch

from dynask.actors.engine.attention import AttentionMetadata, PagedPrefill
from dynask.actors.engine.cuda.triton_attention import MAX_PREFILL_SPLITS, PREFILL_BLOCK_M
from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.step_plan import StepPlan


class ShortPrefillInputs:
    """The graph's static inputs (token rows, the sampled row, the tile, the block table)
    and the forward pass over them; the graph captures ``forward`` once."""

    def __init__(
        self, group: int, scratch_slot: int, max_blocks_per_seq: int, device: torch.device
    ) -> None:
        self.max_tokens = max(1, PREFILL_BLOCK_M // group)
        self.max_blocks = max_blocks_per_seq
        self.scratch_slot = scratch_slot
        self.device = device
        self.longs = torch.zeros((3, self.max_tokens), dtype=torch.long, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        tables = torch.zeros((1, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.tiles = torch.zeros((4, 1), dtype=torch.int32, device=device)
        paged = PagedPrefill(tables, self.tiles, MAX_PREFILL_SPLITS)
        self.meta = AttentionMetadata(slot_mapping=self.longs[2], paged_prefill=paged)
        # A one-token chunk at position 0 whose KV goes to the scratch block (the capture's).
        self.longs[2] = scratch_slot
        self.tiles[2, 0] = 1

    def fits(self, plan: StepPlan, samples: bool) -> bool:
        """Whether ``plan`` is a step these inputs take (``samples``: its chunk samples)."""
        if plan.decode_tables or len(plan.prefills) != 1 or not samples:
            return False
        span = plan.prefills[0]
        return (
            span.num_cached > 0
            and 1 < span.num_new <= self.max_tokens
            and len(span.block_ids) <= self.max_blocks
        )

    def fill(self, plan: StepPlan) -> None:
        """Copies ``plan``'s rows, tile and block table in; nothing waits for the GPU."""
        span = plan.prefills[0]
        pad = self.max_tokens - span.num_new
        rows = plan.rows
        longs = torch.tensor(
            rows.ids + [0] * pad
            + rows.positions + [0] * pad
            + rows.slots + [self.scratch_slot] * pad
            + [span.num_new - 1],  # the sampled row
            dtype=torch.long,
        )  # fmt: skip
        tile = [0, 0, span.num_new, span.num_cached]  # chunk, first row, count, position
        ints = torch.tensor(tile + span.block_ids, dtype=torch.int32)
        if self.device.type == "cuda":
            longs, ints = longs.pin_memory(), ints.pin_memory()
        count = 3 * self.max_tokens
        self.longs.copy_(longs[:count].view(3, -1), non_blocking=True)
        self.last.copy_(longs[count:], non_blocking=True)
        self.tiles.copy_(ints[:4].view(4, 1), non_blocking=True)
        assert self.meta.paged_prefill is not None
        # Only the blocks the chunk covers: the kernel reads no entry past them.
        width = len(span.block_ids)
        table = self.meta.paged_prefill.block_tables[:, :width]
        table.copy_(ints[4:].view(1, width), non_blocking=True)

    def forward(
        self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Logits ``[1, vocab]`` of the sampled row."""
        hidden = model(self.longs[0], self.longs[1], kv_caches, self.meta)
        return model.compute_logits(hidden.index_select(0, self.last))


class ShortPrefillGraph:
    """The forward pass and LM head of a short cached-prefix prefill step, captured once."""

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        group: int,
        scratch_slot: int,
        max_blocks_per_seq: int,
        pool: Any,
    ) -> None:
        device = kv_caches[0][0].device
        self.inputs = ShortPrefillInputs(group, scratch_slot, max_blocks_per_seq, device)
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: kernels compile, the split scratch is made
            self.inputs.forward(model, kv_caches)
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, pool=pool):
            self._logits = self.inputs.forward(model, kv_caches)

    def fits(self, plan: StepPlan, samples: bool) -> bool:
        return self.inputs.fits(plan, samples)

    def replay(self, plan: StepPlan) -> torch.Tensor:
        """Logits ``[1, vocab]`` of the chunk's last token; nothing waits for the GPU.

        A view of the graph's output, which the next replay overwrites.
        """
        self.inputs.fill(plan)
        self._graph.replay()
        return self._logits
