"""A step's inputs on a CUDA device, and decode steps replayed from CUDA graphs.

Design decisions:

* Every per-step host array (token ids, positions, KV slots; decode lengths and block
  tables) is built in Python lists and crosses to the GPU as one pinned buffer per dtype
  with ``non_blocking`` copies: two small transfers a step, no synchronisation.
* Decode rows read the KV blocks in place (``PagedDecode``); prefill chunks go to the
  paged prefill kernel in one launch, except a step's only chunk when it is fresh (no
  cached prefix, no decode rows beside it), which attends to its own keys with SDPA
  (flash attention, the fastest for one long prompt). One launch per layer for all
  chunks of a mixed step instead of one SDPA call each: eager mixed steps are bound by
  the host's launches.
* A decode-only step of ``n`` rows replays the graph captured for the smallest bucket
  ``>= n`` (1, 2, 4, 8, then steps of 8 up to 64, then of 32, up to ``max_num_seqs``).
  Rows past ``n`` are padding: length 0 (the kernel skips them), position 0, and their
  KV slot is the scratch block that the runner allocates past the pool's blocks, so
  padding never writes into a block a sequence owns.
* The graphs share one memory pool and are captured largest first. The static inputs
  are sized for the largest bucket and ``max_blocks_per_seq`` (``max_model_len``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from dynask.actors.engine.attention import (
    AttentionMetadata,
    PagedDecode,
    PagedPrefill,
    PrefillChunk,
)
from dynask.actors.engine.cuda.triton_attention import (
    decode_splits,
    num_prefill_tiles,
    prefill_splits,
    prefill_tiles,
)
from dynask.actors.engine.model import CausalLM
from dynask.actors.engine.step_plan import StepPlan, StepRows, host_tensor
from dynask.kv.block import ceil_div

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudaLayout:
    """What the CUDA step builder needs to know about the model and the device."""

    block_size: int
    num_kv_heads: int
    group: int  # query heads per KV head
    num_sms: int
    scratch_slot: int  # first slot of the scratch block (padding writes go there)
    # EngineConfig.cuda_fast_paths (the default): prefill key splits, cuDNN for a long
    # lone chunk; off, the step's inputs are those of before.
    fast_paths: bool = True


@dataclass
class CudaStepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata


def block_row(block_ids: list[int], width: int) -> list[int]:
    return block_ids[:width] + [0] * (width - len(block_ids))


def to_device(
    rows: list[list[list[int]]] | list[list[int]] | list[int],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One pinned host tensor, copied without waiting for the GPU."""
    host = host_tensor(rows, dtype).pin_memory()
    return host.to(device, non_blocking=True)


def build_cuda_inputs(plan: StepPlan, layout: CudaLayout, device: torch.device) -> CudaStepInputs:
    """Inputs of an eager step: decode rows read blocks in place (``PagedDecode``), prefill
    chunks with a cached prefix go to the paged prefill kernel, fresh ones to SDPA."""
    packed = to_device(plan.rows.columns(), torch.long, device)
    meta = AttentionMetadata(slot_mapping=packed[2])
    meta.cuda_fast_paths = layout.fast_paths
    decode_tables = plan.decode_tables
    if decode_tables:
        width = max(len(t) for t in decode_tables)
        positions = plan.rows.positions[: len(decode_tables)]
        lengths = to_device([p + 1 for p in positions], torch.int32, device)
        tables = to_device([block_row(t, width) for t in decode_tables], torch.int32, device)
        splits = decode_splits(len(decode_tables), layout.num_kv_heads, layout.num_sms)
        meta.paged_decode = PagedDecode(tables, lengths, splits)
    # A lone fresh chunk goes to flash attention (fastest for long prompts); in a step that
    # mixes decode rows or several chunks every chunk goes to the one paged prefill launch
    # (its keys are in the cache already): one launch per layer instead of one per chunk.
    lone = not decode_tables and len(plan.prefills) == 1
    cached = [span for span in plan.prefills if span.num_cached > 0 or not lone]
    meta.prefills = [
        PrefillChunk(span.first_row, span.first_row + span.num_new, 0, None)
        for span in plan.prefills
        if span.num_cached == 0 and lone
    ]
    if cached:
        width = max(ceil_div(s.num_cached + s.num_new, layout.block_size) for s in cached)
        tables = to_device([block_row(s.block_ids, width) for s in cached], torch.int32, device)
        spans = [(s.first_row, s.num_new, s.num_cached) for s in cached]
        if layout.fast_paths:
            meta.paged_prefill = _split_paged_prefill(tables, spans, layout, device)
        else:
            meta.paged_prefill = PagedPrefill(tables, prefill_tiles(spans, layout.group, device))
    return CudaStepInputs(packed[0], packed[1], meta)


def _split_paged_prefill(
    tables: torch.Tensor,
    spans: list[tuple[int, int, int]],
    layout: CudaLayout,
    device: torch.device,
) -> PagedPrefill:
    """The fast paths' paged prefill: keys split when the tiles alone leave the GPU idle."""
    splits = prefill_splits(
        num_prefill_tiles(spans, layout.group),
        layout.num_kv_heads,
        layout.num_sms,
        max(cached + count for _, count, cached in spans),
    )
    tiles = prefill_tiles(spans, layout.group, device, pinned=True)
    return PagedPrefill(tables, tiles, splits)


def decode_buckets(max_batch: int) -> list[int]:
    buckets = [b for b in (1, 2, 4) if b < max_batch]
    buckets += list(range(8, min(max_batch, 64) + 1, 8))
    buckets += list(range(96, max_batch + 1, 32))
    if not buckets or buckets[-1] != max_batch:
        buckets.append(max_batch)
    return sorted(set(buckets))


class DecodeGraphs:
    """Decode steps (forward pass + LM head) captured once per batch-size bucket."""

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        layout: CudaLayout,
        max_batch: int,
        max_blocks_per_seq: int,
    ) -> None:
        device = kv_caches[0][0].device
        self.layout = layout
        self.buckets = decode_buckets(max_batch)
        self.max_batch = self.buckets[-1]
        self._longs = torch.zeros((3, self.max_batch), dtype=torch.long, device=device)
        self._lens = torch.zeros(self.max_batch, dtype=torch.int32, device=device)
        self._tables = torch.zeros(
            (self.max_batch, max_blocks_per_seq), dtype=torch.int32, device=device
        )
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        started = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        for batch in reversed(self.buckets):
            self._capture(model, kv_caches, batch, pool)
        log.info(
            "captured decode CUDA graphs for batch sizes %s in %.1fs",
            self.buckets,
            time.monotonic() - started,
        )

    def _meta(self, batch: int) -> AttentionMetadata:
        splits = decode_splits(batch, self.layout.num_kv_heads, self.layout.num_sms)
        paged = PagedDecode(self._tables[:batch], self._lens[:batch], splits)
        return AttentionMetadata(slot_mapping=self._longs[2, :batch], paged_decode=paged)

    def _capture(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        batch: int,
        pool: Any,
    ) -> None:
        self._fill_padding(0)
        meta = self._meta(batch)
        ids, positions = self._longs[0, :batch], self._longs[1, :batch]
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: Triton compiles, cuBLAS picks kernels
            model.compute_logits(model(ids, positions, kv_caches, meta))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._logits[batch] = model.compute_logits(model(ids, positions, kv_caches, meta))
        self._graphs[batch] = graph

    def _fill_padding(self, start: int) -> None:
        self._longs[:2, start:] = 0
        self._longs[2, start:] = self.layout.scratch_slot
        self._lens[start:] = 0

    def bucket_for(self, rows: int) -> int | None:
        return next((b for b in self.buckets if b >= rows), None)

    def replay(self, tokens: StepRows, tables: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of a decode-only step (one token row per table)."""
        return self.launch(tokens.ids, tokens.positions, tokens.slots, tables)

    def launch(
        self,
        ids: list[int] | torch.Tensor,
        positions: list[int],
        slots: list[int],
        tables: list[list[int]],
    ) -> torch.Tensor:
        """Replays the graph of a decode step; nothing waits for the GPU.

        ``ids`` may be a device tensor (the previous step's sampled ids, not yet read
        back: asynchronous scheduling), copied into the graph's input on the device.
        Returns the logits ``[rows, vocab]``, a view of the graph's output that the next
        replay of the same bucket overwrites.
        """
        rows = len(tables)
        batch = self.bucket_for(rows)
        if batch is None:
            raise ValueError(f"decode batch of {rows} rows exceeds the largest graph bucket")
        width = max(len(t) for t in tables)
        if isinstance(ids, torch.Tensor):
            host = host_tensor([positions, slots], torch.long)
            self._longs[1:, :rows].copy_(host.pin_memory(), non_blocking=True)
            self._longs[0, :rows].copy_(ids)
        else:
            host = host_tensor([ids, positions, slots], torch.long)
            self._longs[:, :rows].copy_(host.pin_memory(), non_blocking=True)
        lengths = host_tensor([p + 1 for p in positions], torch.int32)
        self._lens[:rows].copy_(lengths.pin_memory(), non_blocking=True)
        host_tables = host_tensor([block_row(t, width) for t in tables], torch.int32)
        self._tables[:rows, :width].copy_(host_tables.pin_memory(), non_blocking=True)
        if rows < batch:
            self._fill_padding(rows)
        self._graphs[batch].replay()
        return self._logits[batch][:rows]

    def replay_greedy_chain(
        self,
        ids: list[int],
        positions: list[list[int]],
        slots: list[list[int]],
        tables: list[list[int]],
    ) -> torch.Tensor:
        """Greedy tokens ``[steps, rows]`` of consecutive decode steps, chained on the GPU.

        Step ``i``'s positions and slots come from one host copy made up front; its token
        ids are the argmax of step ``i - 1``'s logits, copied on the device. ``tables``
        must already cover the last step. Nothing waits for the GPU here.
        """
        rows, steps = len(ids), len(positions)
        batch = self.bucket_for(rows)
        if batch is None:
            raise ValueError(f"decode batch of {rows} rows exceeds the largest graph bucket")
        device = self._longs.device
        width = max(len(t) for t in tables)
        plan = to_device([positions, slots], torch.long, device)  # [2, steps, rows]
        lengths = to_device([[p + 1 for p in row] for row in positions], torch.int32, device)
        self._longs[0, :rows].copy_(host_tensor(ids, torch.long).pin_memory(), non_blocking=True)
        host_tables = host_tensor([block_row(t, width) for t in tables], torch.int32)
        self._tables[:rows, :width].copy_(host_tables.pin_memory(), non_blocking=True)
        if rows < batch:
            self._fill_padding(rows)
        chosen = torch.empty((steps, rows), dtype=torch.long, device=device)
        logits = self._logits[batch][:rows]
        for step in range(steps):
            self._longs[1:, :rows].copy_(plan[:, step])
            self._lens[:rows].copy_(lengths[step])
            self._graphs[batch].replay()
            torch.argmax(logits, dim=-1, out=chosen[step])
            if step + 1 < steps:
                self._longs[0, :rows].copy_(chosen[step])
        return chosen
