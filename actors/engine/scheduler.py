"""Continuous batching: which sequences run this step, and with how many tokens.

Each step has a token budget (``max_num_batched_tokens``). Running sequences go first, in
arrival order: a decoding sequence takes one token, a sequence still prefilling takes the
next chunk of its prompt. When blocks run out, the most recently admitted sequence is
preempted by recompute (its blocks are freed; its full blocks stay in the prefix cache, so
the recompute is often a cache hit). Waiting sequences are admitted while budget, blocks
and ``max_num_seqs`` allow, each starting after its longest cached prefix.

A prompt whose prefill a step advanced without finishing is noted in
``prefill_progress`` with the tokens it still has to compute: the router counts an
actor's queued prefill, and a long prompt halfway through is half the work it was.

Chunked prefill under decode load: with ``max_prefill_tokens_with_decodes`` set, a step
that has decode rows gives prefill chunks (running ones and new admissions together) at
most that many tokens, so a long prompt arriving does not stretch every running stream's
next token by a whole prefill chunk; a step without decode rows still takes the whole
budget. ``None`` (the default) leaves prefill bound only by ``max_num_batched_tokens``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dynask.actors.api.outputs import FinishReason
from dynask.actors.engine.kv_cache.manager import NO_HIT, KVCacheManager
from dynask.actors.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    max_prefill_tokens_with_decodes: int | None = None  # None: no cap beyond the budget

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"SchedulerConfig '{name}' has value {value!r}; expected >= 1")
        cap = self.max_prefill_tokens_with_decodes
        if cap is not None and cap < 1:
            raise ValueError(
                f"SchedulerConfig 'max_prefill_tokens_with_decodes' has value {cap!r}; "
                "expected >= 1 or None"
            )


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


@dataclass
class PrefixCacheCounters:
    queried_tokens: int = 0
    hit_tokens: int = 0


@dataclass
class _Budget:
    """A step's token budget; ``prefill`` (None: unbounded) caps prefill chunks within it."""

    total: int
    prefill: int | None = None

    def grant(self, wanted: int, decode: bool) -> int:
        limit = self.total if decode or self.prefill is None else min(self.total, self.prefill)
        return max(0, min(wanted, limit))

    def take(self, tokens: int, decode: bool) -> None:
        self.total -= tokens
        if not decode and self.prefill is not None:
            self.prefill -= tokens


def _decodes(seq: Sequence) -> bool:
    """Whether ``seq``'s next step is one decode token (not a prompt or recompute chunk)."""
    return seq.num_pending_tokens == 1 and seq.num_computed_tokens > 0


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, eos_token_ids: frozenset[int]
    ) -> None:
        self.config = config
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_counters = PrefixCacheCounters()
        self.num_preemptions = 0
        # Request id -> prompt tokens still to compute, for the prompts the steps since the
        # last ``take_prefill_progress`` advanced without finishing.
        self.prefill_progress: dict[str, int] = {}

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = _Budget(self.config.max_num_batched_tokens, self._prefill_cap())
        self._schedule_running(out, budget)
        if not out.preempted:
            self._admit_waiting(out, budget)
        return out

    def _prefill_cap(self) -> int | None:
        """Prefill tokens this step may take: capped while any running sequence decodes."""
        cap = self.config.max_prefill_tokens_with_decodes
        if cap is None or not any(_decodes(seq) for seq in self.running):
            return None
        return cap

    def _schedule_running(self, out: SchedulerOutput, budget: _Budget) -> None:
        index = 0
        while index < len(self.running) and budget.total > 0:
            seq = self.running[index]
            num_new = budget.grant(seq.num_pending_tokens, decode=_decodes(seq))
            if num_new == 0:  # a prefill past this step's prefill cap waits its turn
                index += 1
                continue
            while not self.kv.allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.chunks.append(ScheduledChunk(seq, num_new))
                budget.take(num_new, decode=_decodes(seq))
                index += 1

    def _admit_waiting(self, out: SchedulerOutput, budget: _Budget) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            if budget.grant(1, decode=False) == 0:
                break  # no prefill token left this step: nothing to look up
            seq = self.waiting[0]
            hit = self.kv.lookup_prefix(seq) if seq.num_computed_tokens == 0 else NO_HIT
            cached = hit.num_blocks * self.kv.block_size
            num_new = budget.grant(seq.num_pending_tokens - cached, decode=False)
            if num_new == 0 or not self.kv.allocate(seq, num_new, hit):
                break
            self._count_prefix_hit(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.chunks.append(ScheduledChunk(seq, num_new))
            budget.take(num_new, decode=False)

    def _count_prefix_hit(self, seq: Sequence) -> None:
        # What ``allocate`` took from the cache (a lower-tier hit may load short of the
        # lookup when a block turns out unreadable), so: the tokens now computed.
        cached = seq.num_computed_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = cached
            self.prefix_counters.queried_tokens += len(seq.prompt_token_ids)
            self.prefix_counters.hit_tokens += cached

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def count_computed(self, out: SchedulerOutput) -> None:
        """Counts a step's tokens as computed and registers the blocks they filled in the
        prefix cache (one KV event per sequence).

        Needs no sampled id, so asynchronous scheduling does it while the step's GPU work
        runs (an 8k-token prompt's 512 blocks: ~1.5 ms of host work that sat after the
        GPU). Safe before that work ends: every later step that reads the blocks queues
        behind it on the stream, and the step's sequences hold them until ``postprocess``.
        """
        for chunk in out.chunks:
            seq = chunk.seq
            seq.num_computed_tokens += chunk.num_new_tokens
            self.kv.cache_full_blocks(seq)
            if not seq.output_token_ids and seq.num_pending_tokens > 0:
                self.prefill_progress[seq.request_id] = seq.num_pending_tokens

    def take_prefill_progress(self) -> dict[str, int]:
        """The progress noted since the last call (``LLMEngine.add_prefill_listener``)."""
        progress, self.prefill_progress = self.prefill_progress, {}
        return progress

    def postprocess(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Sequence]:
        """Applies a step's results; returns the sequences that received a token."""
        self.count_computed(out)
        return self.apply_sampled(out, sampled)

    def apply_sampled(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Sequence]:
        """The second half of ``postprocess``, after ``count_computed``: appends each sampled
        token and ends the sequences it finishes; returns those that received a token."""
        advanced = []
        for chunk, token in zip(out.chunks, sampled, strict=True):
            seq = chunk.seq
            if token is None:
                continue
            seq.output_token_ids.append(token)
            seq.detokenizer.push(token)
            advanced.append(seq)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
        return advanced

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if token in params.stop_token_ids:
            seq.stop_reason = token
            return FinishReason.STOP
        if not params.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        if seq.detokenizer.stopped_by is not None:
            seq.stop_reason = seq.detokenizer.stopped_by
            return FinishReason.STOP
        if seq.grammar is not None and seq.grammar.terminated:  # its grammar is complete
            return FinishReason.STOP
        if len(seq.output_token_ids) >= params.max_tokens:
            return FinishReason.LENGTH
        if seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends a sequence wherever it is and frees every block it holds."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
