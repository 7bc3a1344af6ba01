"""Asynchronous scheduling: the next decode step runs on the GPU while the host applies this one.

A synchronous step leaves the GPU idle while the host reads the sampled ids back, applies
them (postprocess: detokenizing, stop checks, prefix-cache registration), hands out the
deltas and builds the next step's inputs: on an H200 (issue 19, 8B bf16) 0.2 ms at batch
1, 1.2 ms at 64 and 4 ms at 256, serially with the GPU. As vLLM v1's async scheduling and
SGLang's overlap scheduler do, a decode-only step here launches step ``N + 1`` before it
reads step ``N``'s tokens: ``N + 1``'s input ids are ``N``'s sampled ids, copied on the
device, and its positions, KV slots and block tables follow from the blocks each sequence
holds (one more token's slot reserved ahead). Only then does the host wait for ``N`` (a
CUDA event after its ids' copy to pinned memory) and apply it through the scheduler's
ordinary postprocess, while the GPU runs ``N + 1``. Each step still hands out one token
per request, so streaming is unchanged (bursts, ``decode_burst``, give ``k`` at a time).

What it costs: a sequence that stops at step ``N`` (EOS, a stop token or string) had step
``N + 1`` computed in vain; that token is dropped and its KV went into a block the sequence
owned and frees (a block not yet full, so never in the prefix cache). A sequence whose
``max_tokens`` or the context ends at ``N`` is left out of ``N + 1``.

When no decode step can follow directly — a request waits for admission, a running
sequence was not in the step (a prefill still in chunks), a row's blocks cannot be
reserved — the step in flight is applied alone (the host waits for it, and its deltas go
out) and the same ``engine.step()`` call schedules at once. The scheduled step (prefill
chunks beside the decode rows) is launched eagerly without waiting for its ids
(``ModelRunner.launch_step``); the next call launches the decode step after it from those
ids on the device (a row just prefilled sits its chunk's length further on) and applies
it. So an arrival waits for the step in flight and its own prefill step, and every call
still hands out one step's tokens. Rows whose logits need the host (penalties,
logit_bias, min_tokens, logprobs, a grammar mask) keep the whole step synchronous.
Greedy and plain sampled rows (temperature, top-k, top-p: drawn on the device from the
row's position-seeded generator) both overlap.

Measured on the H200 (issue 19, 8B bf16, same run against synchronous steps): a decode
step of 5.12 / 9.30 / 22.73 ms at batch 1 / 64 / 256 became 4.60 / 6.12 / 11.91 ms, about
the CUDA-graph replay alone; an arriving request waits for the step in flight first.

On by default on CUDA (``EngineConfig.async_scheduling``); on the CPU the runner computes
each step when it is launched, so nothing overlaps and the step after a stop is wasted
work: off there by default, and the tests turn it on to pin down that the outputs are
those of synchronous steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.actors.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from dynask.actors.engine.sequence import Sequence, SequenceStatus
from dynask.actors.engine.step_plan import is_decode


class PendingTokens:
    """One launched step's sampled ids: on the device now, on the host once ``tokens()``."""

    def __init__(self, chosen: torch.Tensor) -> None:
        self.device_tokens = chosen
        self._event: torch.cuda.Event | None = None
        if chosen.device.type == "cuda":
            self._host = torch.empty(chosen.shape, dtype=chosen.dtype, pin_memory=True)
            self._host.copy_(chosen, non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
        else:
            self._host = chosen

    def tokens(self) -> list[int]:
        """The ids, waiting for the step's GPU work (and nothing launched after it)."""
        if self._event is not None:
            self._event.synchronize()  # type: ignore[no-untyped-call]
        return [int(t) for t in self._host.tolist()]


class StepLauncher(Protocol):
    """What asynchronous scheduling needs of the runner (``ModelRunner.launch_*``)."""

    def launch_decode(
        self,
        seqs: list[Sequence],
        previous: PendingTokens | None,
        rows: list[int],
        in_flight: list[int] | None = None,
    ) -> PendingTokens: ...

    def launch_step(self, chunks: list[ScheduledChunk]) -> tuple[PendingTokens, list[int]]: ...


@dataclass
class InflightStep:
    chunks: list[ScheduledChunk]  # the step as scheduled
    sampled: list[int]  # per token of ``pending``: the index of its chunk
    pending: PendingTokens

    @classmethod
    def decode(cls, seqs: list[Sequence], pending: PendingTokens) -> InflightStep:
        return cls([ScheduledChunk(seq, 1) for seq in seqs], list(range(len(seqs))), pending)


def overlaps(seq: Sequence, ahead: int, max_model_len: int) -> bool:
    """Whether ``seq`` may decode ``ahead`` tokens past what the host has applied.

    Its logits must need no host-side state (penalties, bias, logprobs, a grammar), and it
    must still want a token after the ``ahead`` ones in flight (``max_tokens``, context).
    """
    params = seq.params
    if seq.grammar is not None or params.processes_logits or params.logprobs is not None:
        return False
    return (
        len(seq.output_token_ids) + ahead < params.max_tokens
        and seq.num_tokens + ahead < max_model_len
    )


class AsyncDecodes:
    """The step in flight, if any, and how the engine moves it along."""

    def __init__(
        self,
        runner: StepLauncher,
        scheduler: Scheduler,
        kv: KVCacheManager,
        max_model_len: int,
        mixed_steps: bool = True,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.kv = kv
        self.max_model_len = max_model_len
        # False: steps with prefill chunks run synchronously, so the decode steps after
        # them are scheduled (and burst: ``decode_burst``) rather than chained on the device.
        self.mixed_steps = mixed_steps
        self.inflight: InflightStep | None = None

    def start(self, out: SchedulerOutput) -> bool:
        """Launches ``out`` without waiting for it, when every row overlaps: a decode step
        from its CUDA graph, a step with prefill chunks eagerly (at least one must sample)."""
        if out.preempted or not out.chunks:
            return False
        if not all(overlaps(chunk.seq, 0, self.max_model_len) for chunk in out.chunks):
            return False
        if all(is_decode(chunk) and chunk.samples for chunk in out.chunks):
            seqs = [chunk.seq for chunk in out.chunks]
            self.inflight = InflightStep.decode(seqs, self.runner.launch_decode(seqs, None, []))
            return True
        if not self.mixed_steps or not any(chunk.samples for chunk in out.chunks):
            return False
        pending, sampled = self.runner.launch_step(out.chunks)
        self.inflight = InflightStep(list(out.chunks), sampled, pending)
        return True

    def advance(self, may_continue: bool) -> list[Sequence]:
        """Launches the decode step after the one in flight (when it can), then applies the
        one in flight; returns the sequences that received a token (as ``postprocess`` does).

        ``may_continue``: no request waits for admission (the engine's inbox is empty).
        """
        current = self.inflight
        assert current is not None
        self.inflight = None
        chunks = current.chunks
        live = [(row, chunks[i]) for row, i in enumerate(current.sampled) if _runs(chunks[i])]
        # Every running sequence must have sampled in the step (none left prefilling).
        if may_continue and live and len(live) == len(self.scheduler.running):
            self._launch_next(current, live)
        applied = [i for i, chunk in enumerate(chunks) if _runs(chunk)]
        step = SchedulerOutput([chunks[i] for i in applied])
        self.scheduler.count_computed(step)  # while the GPU still runs the step
        tokens = current.pending.tokens()
        token_of: dict[int, int] = {i: tokens[row] for row, i in enumerate(current.sampled)}
        return self.scheduler.apply_sampled(step, [token_of.get(i) for i in applied])

    def _launch_next(self, current: InflightStep, live: list[tuple[int, ScheduledChunk]]) -> None:
        ahead = [(row, c) for row, c in live if overlaps(c.seq, 1, self.max_model_len)]
        # Slots for the tokens in flight and the next one; on a failure the scheduler runs
        # next (and may preempt). Blocks reserved before it stay with their sequence.
        if not ahead or not all(self.kv.allocate(c.seq, c.num_new_tokens + 1) for _, c in ahead):
            return
        seqs = [c.seq for _, c in ahead]
        rows = [row for row, _ in ahead]
        in_flight = [c.num_new_tokens for _, c in ahead]
        pending = self.runner.launch_decode(seqs, current.pending, rows, in_flight)
        self.inflight = InflightStep.decode(seqs, pending)

    def drop(self) -> None:
        """Forgets the step in flight (its requests are being failed)."""
        self.inflight = None


def _runs(chunk: ScheduledChunk) -> bool:
    return chunk.seq.status is SequenceStatus.RUNNING
