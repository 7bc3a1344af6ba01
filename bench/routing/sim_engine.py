"""The simulated engine of ``router_sim``: the mocker's scheduler and prefix cache in
miniature, at its timing (``simulated_step_ms``).

Design decisions (see ``actors/engine/scheduler.py``, which it follows):

- A step has ``max_num_batched_tokens``; running sequences go first (a decode takes one
  token, a prefill its next chunk), then waiting ones are admitted in arrival order, each
  starting after its longest cached prefix, looked up at admission and never covering the
  prompt's last token.
- Full blocks enter an LRU prefix cache of ``num_kv_blocks`` as they are computed; the
  step reports them (the KV events). Not modelled: preemption (the trace slices never
  fill the blocks with running sequences) and host time.
- A block is named by its trace hash id and its place in that 512-token trace block:
  the ids are chained, so the pair stands for the whole prefix, as a block hash does.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from bench.routing.trace import TRACE_BLOCK_TOKENS, TraceRequest
from dynask.actors.backends.mocker import StepShape, simulated_step_ms
from dynask.actors.backends.mocker_config import MockerConfig

BlockKey = tuple[int, int]  # (trace hash id, 64-token block within it): chained like a hash


def block_keys(request: TraceRequest, block_size: int) -> list[BlockKey]:
    """The prompt's full engine blocks, as keys unique to their prefix."""
    per_trace_block = TRACE_BLOCK_TOKENS // block_size
    full = request.input_length // block_size
    return [(request.hash_ids[i // per_trace_block], i % per_trace_block) for i in range(full)]


@dataclass
class SimSequence:
    index: int
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    keys: list[BlockKey]
    computed: int = 0
    generated: int = 0
    cached_tokens: int = 0
    first_token_ms: float | None = None


@dataclass(frozen=True)
class EngineOrder:
    """How a simulated engine orders its prefills (``router_sim --engine-order``): ``fcfs``
    (the engine's: running first, then arrivals), ``srpt`` (fewest uncached tokens left
    first), ``short:T`` (prompts with at most T tokens left ahead of longer ones, each group
    first come first served), ``cap:T`` (first come first served, no prompt takes more than
    T tokens of a step another prefill shares)."""

    kind: str
    tokens: int = 0

    @classmethod
    def parse(cls, text: str) -> EngineOrder:
        kind, _, tokens = text.partition(":")
        if kind not in ("fcfs", "srpt", "short", "cap") or (kind in ("short", "cap")) != bool(
            tokens
        ):
            raise ValueError(f"engine order {text!r}: fcfs, srpt, short:TOKENS or cap:TOKENS")
        return cls(kind, int(tokens or 0))

    def key(self, seq: SimSequence) -> tuple[int, float]:
        left = seq.prompt_tokens - seq.computed
        if self.kind == "srpt":
            return (left, seq.arrival_ms)
        if self.kind == "short":
            return (int(left > self.tokens), seq.arrival_ms)
        return (0, seq.arrival_ms)


class SimEngine:
    """One mocker engine's scheduler and prefix cache (see the module docstring)."""

    def __init__(self, name: str, config: MockerConfig, order: str = "fcfs") -> None:
        self.name = name
        self.config = config
        self.order = EngineOrder.parse(order)
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []
        self.cache: OrderedDict[BlockKey, None] = OrderedDict()
        self.busy_until: float | None = None

    def cached_prefix_blocks(self, seq: SimSequence) -> int:
        limit = (seq.prompt_tokens - 1) // self.config.block_size
        count = 0
        for key in seq.keys[:limit]:
            if key not in self.cache:
                break
            count += 1
        return count

    def step(self, now_ms: float) -> tuple[float, list[tuple[SimSequence, int]], list[BlockKey]]:
        """Schedules and runs one step from ``now_ms``: its end, the chunks, new blocks."""
        chunks = self._schedule() if self.order.kind == "fcfs" else self._reorder()
        return self._run(now_ms, chunks)

    def _admit(self, seq: SimSequence) -> None:
        hit = self.cached_prefix_blocks(seq) * self.config.block_size
        for key in seq.keys[: hit // self.config.block_size]:
            self.cache.move_to_end(key)
        seq.computed = seq.cached_tokens = hit
        self.running.append(seq)

    def _schedule(self) -> list[tuple[SimSequence, int]]:
        """The engine's order: running sequences first, then arrivals, first come first."""
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[SimSequence, int]] = []
        for seq in self.running:
            if budget <= 0:
                break
            pending = seq.prompt_tokens - seq.computed if seq.first_token_ms is None else 1
            grant = min(pending, budget)
            chunks.append((seq, grant))
            budget -= grant
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting.popleft()
            self._admit(seq)
            grant = min(seq.prompt_tokens - seq.computed, budget)
            chunks.append((seq, grant))
            budget -= grant
        return chunks

    def _reorder(self) -> list[tuple[SimSequence, int]]:
        """An experiment the engine does not have (``EngineOrder``): decodes first, then
        every admitted prompt's prefill in the order's order."""
        budget = self.config.max_num_batched_tokens
        chunks = [(seq, 1) for seq in self.running if seq.first_token_ms is not None][:budget]
        budget -= len(chunks)
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            self._admit(self.waiting.popleft())
        prefilling = [seq for seq in self.running if seq.first_token_ms is None]
        prefilling.sort(key=self.order.key)
        for seq in prefilling:
            if budget <= 0:
                break
            grant = min(seq.prompt_tokens - seq.computed, budget)
            if self.order.kind == "cap" and len(prefilling) > 1:
                grant = min(grant, self.order.tokens)
            chunks.append((seq, grant))
            budget -= grant
        return chunks

    def _run(
        self, now_ms: float, chunks: list[tuple[SimSequence, int]]
    ) -> tuple[float, list[tuple[SimSequence, int]], list[BlockKey]]:
        decodes = [seq for seq, _ in chunks if seq.first_token_ms is not None]
        shape = StepShape(
            prefill_tokens=sum(n for seq, n in chunks if seq.first_token_ms is None),
            decode_seqs=len(decodes),
            active_decode_blocks=sum(
                -(-(s.prompt_tokens + s.generated) // self.config.block_size) for s in decodes
            ),
        )
        end = now_ms + simulated_step_ms(self.config, shape)
        stored: list[BlockKey] = []
        for seq, tokens in chunks:
            if seq.first_token_ms is not None:
                seq.generated += 1
                continue
            before = seq.computed // self.config.block_size
            seq.computed += tokens
            after = min(seq.computed // self.config.block_size, len(seq.keys))
            for key in seq.keys[before:after]:
                if key not in self.cache:
                    stored.append(key)
                self.cache[key] = None
                self.cache.move_to_end(key)
            if seq.computed == seq.prompt_tokens:
                seq.first_token_ms = end
                seq.generated = 1
        while len(self.cache) > self.config.num_kv_blocks:
            self.cache.popitem(last=False)
        self.running = [s for s in self.running if s.generated < s.output_tokens]
        return end, chunks, stored
