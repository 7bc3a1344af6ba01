"""The simulated engine of ``router_sim``: the mocker's scheduler and prefix cache in
miniature, at its timing (``simulated_step_ms``).

Design decisions (see ``actors/engine/scheduler.py`` and ``kv_cache/manager.py``, which it
follows):

- A step has ``max_num_batched_tokens``; running sequences go first (a decode takes one
  token, a prefill its next chunk), then waiting ones are admitted in arrival order, each
  starting after its longest cached prefix, looked up at admission and never covering the
  prompt's last token.
- The cache is the engine's block pool: ``num_kv_blocks`` blocks, a block held by a
  running sequence is never evicted, a freed one joins the free queue (a sequence's
  blocks tail first, so shared prefixes go last) and the queue's head is evicted when
  blocks are allocated. The queue is segmented as the pool's (``kv.free_queue``): a
  block a sequence took from the cache is freed into the protected segment (at most
  ``prefix_cache_protected_share`` of the blocks; beyond it the least recently freed is
  demoted), evicted only once the probation segment is empty; share 0 is plain LRU
  (Dynamo's mocker). A sequence that cannot get its blocks waits (admission) or
  preempts the most recently admitted one (running), which starts again later. Full
  prompt blocks enter the cache as they are computed, and the step reports the blocks
  stored and evicted (the KV events). Not modelled: host time.
- A block is named by its trace hash id and its place in that 512-token trace block:
  the ids are chained, so the pair stands for the whole prefix, as a block hash does.
  A sequence's other blocks (its last partial prompt block, its output) are anonymous:
  no other prompt can hit them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

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
    held: list[BlockKey] = field(default_factory=list)  # its cached blocks, in order
    num_blocks: int = 0  # all the blocks it holds, cached or plain
    preemptions: int = 0

    def prefill_target(self) -> int:
        """The tokens to compute before it decodes: its prompt, and after a preemption
        its output so far too."""
        return self.prompt_tokens + max(0, self.generated - 1)

    def prefilling(self) -> bool:
        return self.computed < self.prefill_target()

    def pending_tokens(self) -> int:
        """What its next step wants: the rest of its prefill, or one decode token."""
        return self.prefill_target() - self.computed if self.prefilling() else 1


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
    """One mocker engine's scheduler and block pool (see the module docstring)."""

    def __init__(self, name: str, config: MockerConfig, order: str = "fcfs") -> None:
        self.name = name
        self.config = config
        self.order = EngineOrder.parse(order)
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []
        self.refs: dict[BlockKey, int] = {}  # cached blocks -> sequences holding them
        self.free_cached: OrderedDict[BlockKey, None] = OrderedDict()  # head: evicted first
        self.free_protected: OrderedDict[BlockKey, None] = OrderedDict()  # after free_cached
        self.reused: set[BlockKey] = set()  # taken from the cache since it was stored
        self.protected_capacity = int(config.num_kv_blocks * config.prefix_cache_protected_share)
        self.free_plain = config.num_kv_blocks  # free blocks no prompt can hit
        self.busy_until: float | None = None
        self.preemptions = 0
        self._removed: list[BlockKey] = []

    def cached_prefix_blocks(self, seq: SimSequence) -> int:
        limit = (seq.prompt_tokens - 1) // self.config.block_size
        count = 0
        for key in seq.keys[:limit]:
            if key not in self.refs:
                break
            count += 1
        return count

    def step(
        self, now_ms: float
    ) -> tuple[float, list[tuple[SimSequence, int]], list[BlockKey], list[BlockKey]]:
        """Schedules and runs one step from ``now_ms``: its end, the chunks, the blocks
        stored in and evicted from the cache."""
        self._removed = []
        chunks = self._schedule() if self.order.kind == "fcfs" else self._reorder()
        return self._run(now_ms, chunks)

    # The block pool.

    def _num_free(self) -> int:
        return self.free_plain + len(self.free_cached) + len(self.free_protected)

    def _take(self, count: int) -> None:
        """Allocates ``count`` blocks: plain ones first, then evicts the free queue's head
        (the engine takes its queue's head, plain or cached: its plain blocks are the ones
        freed longest ago or never used, so this differs only in their order)."""
        plain = min(count, self.free_plain)
        self.free_plain -= plain
        for _ in range(count - plain):
            key, _ = (self.free_cached or self.free_protected).popitem(last=False)
            del self.refs[key]
            self.reused.discard(key)
            self._removed.append(key)

    def _allocate(self, seq: SimSequence, tokens: int) -> bool:
        """Reserves blocks for ``tokens`` more of ``seq``'s tokens; False if none are free."""
        needed = -(-(seq.computed + tokens) // self.config.block_size) - seq.num_blocks
        if needed > self._num_free():
            return False
        self._take(max(0, needed))
        seq.num_blocks += max(0, needed)
        return True

    def _free(self, seq: SimSequence) -> None:
        """Returns ``seq``'s blocks, tail first: its cached blocks join the free queue."""
        for key in reversed(seq.held):
            self.refs[key] -= 1
            if self.refs[key] == 0:
                (self.free_protected if key in self.reused else self.free_cached)[key] = None
        while len(self.free_protected) > self.protected_capacity:
            key, _ = self.free_protected.popitem(last=False)
            self.reused.discard(key)
            self.free_cached[key] = None
        self.free_plain += seq.num_blocks - len(seq.held)
        seq.held, seq.num_blocks = [], 0

    def _cache_full_blocks(self, seq: SimSequence, stored: list[BlockKey]) -> None:
        """Names the prompt blocks ``seq`` filled; a block another sequence cached first
        stays plain (the engine keeps one copy of a hash)."""
        full = min(seq.computed // self.config.block_size, len(seq.keys))
        while len(seq.held) < full and seq.keys[len(seq.held)] not in self.refs:
            key = seq.keys[len(seq.held)]
            self.refs[key] = 1
            seq.held.append(key)
            stored.append(key)
        # Blocks after a duplicate stay plain: their chain would hang off another copy.

    # Scheduling.

    def _admit(self, seq: SimSequence, budget: int) -> int:
        """Takes ``seq``'s cached prefix and room for its first chunk of at most ``budget``
        tokens, and runs it; returns the chunk's tokens, 0 (and changes nothing) when the
        blocks are not free."""
        hit = self.cached_prefix_blocks(seq) if seq.computed == 0 else 0
        keys = seq.keys[:hit]
        revived = sum(1 for key in keys if self.refs[key] == 0)
        computed = hit * self.config.block_size
        grant = min(seq.prefill_target() - computed, budget)
        needed = -(-(computed + grant) // self.config.block_size) - hit
        if needed > self._num_free() - revived:
            return 0
        for key in keys:
            if self.refs[key] == 0:
                (self.free_protected if key in self.reused else self.free_cached).pop(key)
            self.refs[key] += 1
            self.reused.add(key)
        seq.held, seq.num_blocks, seq.computed = list(keys), hit, computed
        if seq.preemptions == 0:
            seq.cached_tokens = computed
        self._allocate(seq, grant)
        self.running.append(seq)
        return grant

    def _preempt(self) -> SimSequence:
        victim = self.running.pop()
        self._free(victim)
        victim.computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _schedule(self) -> list[tuple[SimSequence, int]]:
        """The engine's order: running sequences first, then arrivals, first come first;
        a running sequence without room preempts the last admitted one."""
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[SimSequence, int]] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            grant = min(seq.pending_tokens(), budget)
            if not self._allocate(seq, grant):
                if self._preempt() is not seq:
                    continue
                break
            chunks.append((seq, grant))
            budget -= grant
            index += 1
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            grant = self._admit(self.waiting[0], budget)
            if not grant:
                break
            chunks.append((self.waiting.popleft(), grant))
            budget -= grant
        return chunks

    def _reorder(self) -> list[tuple[SimSequence, int]]:
        """An experiment the engine does not have (``EngineOrder``): decodes first, then
        every admitted prompt's prefill in the order's order (no preemption: a chunk
        without room waits)."""
        budget = self.config.max_num_batched_tokens
        chunks = []
        for seq in self.running:
            if not seq.prefilling() and budget > 0 and self._allocate(seq, 1):
                chunks.append((seq, 1))
                budget -= 1
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            if not self._admit(self.waiting[0], self.config.max_num_batched_tokens):
                break
            self.waiting.popleft()
        prefilling = [seq for seq in self.running if seq.prefilling()]
        prefilling.sort(key=self.order.key)
        for seq in prefilling:
            if budget <= 0:
                break
            grant = min(seq.pending_tokens(), budget)
            if self.order.kind == "cap" and len(prefilling) > 1:
                grant = min(grant, self.order.tokens)
            if not self._allocate(seq, grant):
                continue
            chunks.append((seq, grant))
            budget -= grant
        return chunks

    def _run(
        self, now_ms: float, chunks: list[tuple[SimSequence, int]]
    ) -> tuple[float, list[tuple[SimSequence, int]], list[BlockKey], list[BlockKey]]:
        decodes = [seq for seq, _ in chunks if not seq.prefilling()]
        shape = StepShape(
            prefill_tokens=sum(n for seq, n in chunks if seq.prefilling()),
            decode_seqs=len(decodes),
            active_decode_blocks=sum(
                -(-(s.prompt_tokens + s.generated) // self.config.block_size) for s in decodes
            ),
        )
        end = now_ms + simulated_step_ms(self.config, shape)
        stored: list[BlockKey] = []
        for seq, tokens in chunks:
            if not seq.prefilling():
                seq.computed += 1
                seq.generated += 1
                continue
            seq.computed += tokens
            self._cache_full_blocks(seq, stored)
            if seq.computed == seq.prompt_tokens and seq.first_token_ms is None:
                seq.first_token_ms = end
                seq.generated = 1
        for seq in [s for s in self.running if s.generated >= s.output_tokens]:
            self._free(seq)
        self.running = [s for s in self.running if s.generated < s.output_tokens]
        removed = [key for key in self._removed if key not in self.refs]
        return end, chunks, stored, removed
