"""The built-in engine: paged KV cache, continuous batching, prefix caching.

One step reads as three calls — ``scheduler.schedule()`` → ``runner.run(chunks)`` →
``scheduler.postprocess(out, tokens)`` — followed by handing each request its delta. With
asynchronous scheduling (``cuda.overlap``, on by default on CUDA) the step is launched
instead (decode-only from a CUDA graph, mixed eagerly), and each later ``step()`` launches
the next decode step before it applies the one in flight, so the host's work runs while
the GPU computes.
Other threads talk to the engine only through a thread-safe inbox (add, abort), so the
scheduler, block pool and model are touched by the engine thread alone; the KV-cache
calls of other threads (``kv_cache.access``) take the step lock instead.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import torch

from dynask.actors.api.engine_inputs import AbortRequest, check_prompt
from dynask.actors.api.engine_protocol import PrefillListener
from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.streams import OutputFanout, OutputListener, RequestStream
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.cuda.decode_burst import burst_steps
from dynask.actors.engine.cuda.overlap import AsyncDecodes
from dynask.actors.engine.detokenizer import IncrementalDetokenizer
from dynask.actors.engine.engine_parts import EngineParts, build_engine_parts
from dynask.actors.engine.grammar.structured_output import GrammarState, StructuredOutputs
from dynask.actors.engine.kv_cache.access import EngineKVAccess
from dynask.actors.engine.kv_cache.tiers import offload_stats
from dynask.actors.engine.logits.processing import check_logits_params
from dynask.actors.engine.model_runner import ModelRunner
from dynask.actors.engine.sampling import request_seed
from dynask.actors.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from dynask.actors.engine.sequence import Sequence, SequenceStatus
from dynask.kv.hashing import hash_seed

log = logging.getLogger(__name__)


class LLMEngine(EngineKVAccess):
    """Serves generation requests for one model on one device (its KV-cache API for other
    threads, under the step lock, is ``EngineKVAccess``)."""

    def __init__(self, config: EngineConfig, parts: EngineParts | None = None) -> None:
        self.config = config
        self.parts = parts or build_engine_parts(config)
        self.tokenizer = self.parts.tokenizer
        self.max_model_len = self.parts.plan.max_model_len
        # What the control plane fills in for sampling fields a request leaves out.
        self.sampling_defaults = dict(self.parts.sampling_defaults)
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs,
                config.max_num_batched_tokens,
                self.max_model_len,
                config.max_prefill_tokens_with_decodes,
            ),
            self.parts.kv_manager,
            frozenset(self.parts.eos_token_ids),
        )
        self.kv_events = self.parts.event_log
        self.decode_burst = config.decode_burst
        self.async_decodes: AsyncDecodes | None = None  # asynchronous scheduling, if on
        if config.async_scheduling_on() and isinstance(self.parts.runner, ModelRunner):
            self.async_decodes = AsyncDecodes(
                self.parts.runner,
                self.scheduler,
                self.parts.kv_manager,
                self.max_model_len,
                mixed_steps=config.decode_burst <= 1,
            )
        self.structured_outputs = StructuredOutputs(
            self.tokenizer, self.parts.model_config.vocab_size, self.parts.eos_token_ids
        )
        self._inbox: queue.SimpleQueue[Sequence | AbortRequest] = queue.SimpleQueue()
        self._fanout = OutputFanout()
        self._prefill_listeners: list[PrefillListener] = []
        self._sequences: dict[str, Sequence] = {}
        self._step_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._rng = torch.Generator().manual_seed(config.seed)
        self._counters = {"steps": 0, "generated_tokens": 0, "prompt_tokens": 0}
        self._idle_step = False  # the last step scheduled nothing (a disk read pending)
        offload = self.parts.kv_manager.offload
        if offload is not None and offload.prefetcher is not None:
            offload.prefetcher.set_on_ready(self._wakeup.set)

    # ---- the API other threads call -------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> RequestStream:  # satisfies actors.engine_protocol.Engine
        """Queues a request; its deltas arrive on the returned stream."""
        params = params or SamplingParams()
        token_ids = self._prompt_token_ids(prompt)
        check_logits_params(params, self.parts.model_config.vocab_size)
        request_id = request_id or uuid.uuid4().hex
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=token_ids,
            params=params,
            detokenizer=IncrementalDetokenizer(
                self.tokenizer, token_ids, params.stop, params.skip_special_tokens
            ),
            seed=request_seed(params.seed, self._rng),
            hash_seed=hash_seed(params.extra_keys),
            grammar=self._grammar(params, token_ids),
        )
        stream = self._fanout.open_stream(request_id, len(token_ids))
        self._inbox.put(seq)
        self._wakeup.set()
        return stream

    def _grammar(self, params: SamplingParams, token_ids: list[int]) -> GrammarState | None:
        """The request's grammar matcher (compiled here, on the caller's thread)."""
        if params.structured_output is None:
            return None
        if not hasattr(self.parts.runner, "grammar_mask"):  # the mocker's simulated runner
            raise ValueError(
                f"this engine ({self.parts.model_origin}) simulates its model and cannot "
                "constrain it to a grammar; structured outputs need out=torch or out=vllm"
            )
        return self.structured_outputs.start(params.structured_output, token_ids)

    def abort(self, request_id: str) -> None:
        """Cancels a request; its blocks are freed at the start of the next step."""
        self._inbox.put(AbortRequest(request_id))
        self._wakeup.set()

    def add_output_listener(self, listener: OutputListener) -> None:
        """Calls ``listener`` on the engine thread with every step's outputs (one call/step)."""
        self._fanout.add_listener(listener)

    def add_prefill_listener(self, listener: PrefillListener) -> None:
        """Calls ``listener`` on the engine thread after each step that advanced prompts'
        prefill without finishing it (``PrefillProgressEngine``)."""
        self._prefill_listeners.append(listener)

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a chat, with the model's template and the assistant prompt."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def generate(
        self, prompts: list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[RequestStream]:
        """Runs prompts to completion (on the engine thread if started, else inline)."""
        streams = [self.add_request(p, params) for p in prompts]
        if self._thread is None:
            while not all(s.finished for s in streams):
                self.step()
        for stream in streams:
            stream.wait()
        return streams

    def stats(self) -> EngineStats:
        pool = self.parts.kv_manager.pool
        tiers = offload_stats(self.parts.kv_manager.offload, pool.block_size)
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks=pool.num_blocks,
            num_free_kv_blocks=pool.num_free_blocks,
            num_cached_kv_blocks=pool.num_cached_blocks,
            kv_usage=pool.usage,
            prefix_queried_tokens=self.scheduler.prefix_counters.queried_tokens,
            prefix_hit_tokens=self.scheduler.prefix_counters.hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._counters["steps"],
            prompt_tokens=self._counters["prompt_tokens"],
            generated_tokens=self._counters["generated_tokens"],
            **tiers,
        )

    # ---- the engine thread ------------------------------------------------------------

    def start(self) -> None:
        """Runs the engine loop in its own thread until ``shutdown``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dynask-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if not self.scheduler.has_work() and self._inbox.empty() and not self._in_flight():
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                self.step()
            except Exception:
                log.exception("engine step failed; aborting the requests in flight")
                self._fail_in_flight()
            if self._idle_step:  # waiting on a background disk read: sleep until it lands
                self._wakeup.wait(timeout=0.05)
                self._wakeup.clear()

    def step(self) -> list[RequestOutput]:
        """One scheduling step: schedule, run the model, apply results, emit deltas.

        With a step in flight (asynchronous scheduling) it launches the next decode step
        when it can, then applies the one in flight. When it could not launch one because
        work waits (an arrival, a prefill chunk), it publishes the applied step's deltas
        and schedules at once: the scheduled step (a mixed one) is launched without
        waiting for it, and the next call applies it. So a request arriving mid-decode
        waits for the step in flight and then its prefill, not also for the caller's next
        call, and each call still hands out one step's tokens: an inline driver whose
        clients answer between calls (a closed loop) gets its successors admitted one
        step after the step that ended their predecessors, as on the engine thread,
        instead of piled into ever larger admission steps (``bench.engine.mixed_load``:
        TTFT p99 34 -> 52 ms on the H200 with the scheduling left to the next call).
        """
        with self._step_lock:
            outputs = self._drain_inbox()
            if not self._in_flight():
                outputs += self._scheduled_step(apply_launched=True)
                waits = False
            else:
                outputs += self._advance_async()
                waits = not self._in_flight() and self.scheduler.has_work()
        self._publish(outputs)
        if waits:
            with self._step_lock:
                scheduled = self._drain_inbox() + self._scheduled_step(apply_launched=False)
            self._publish(scheduled)
            outputs += scheduled
        return outputs

    def _in_flight(self) -> bool:
        return self.async_decodes is not None and self.async_decodes.inflight is not None

    def _scheduled_step(self, apply_launched: bool) -> list[RequestOutput]:
        """Schedules and runs a step; one launched asynchronously is applied here only
        when ``apply_launched`` (else by the next call)."""
        out = self.scheduler.schedule()
        self._idle_step = not out.chunks
        steps = self._burst_steps(out)  # bursts, when configured, come first
        if steps > 1:
            return self._run_burst(out, steps)
        if self.async_decodes is not None and self.async_decodes.start(out):
            return self._advance_async() if apply_launched else []
        if not out.chunks:
            return []
        tokens = self.parts.runner.run(out.chunks)
        advanced = self.scheduler.postprocess(out, tokens)
        self._counters["generated_tokens"] += len(advanced)
        self._counters["steps"] += 1
        return [self._delta(seq) for seq in advanced]

    def _advance_async(self) -> list[RequestOutput]:
        assert self.async_decodes is not None
        may_continue = not self.scheduler.waiting and self._inbox.empty()
        advanced = self.async_decodes.advance(may_continue)
        self._counters["generated_tokens"] += len(advanced)
        self._counters["steps"] += 1
        return [self._delta(seq) for seq in advanced]

    def _burst_steps(self, out: SchedulerOutput) -> int:
        if self.decode_burst <= 1 or self.scheduler.waiting or not self._inbox.empty():
            return 1
        return burst_steps(out, self.parts.kv_manager, self.decode_burst, self.max_model_len)

    def _run_burst(self, out: SchedulerOutput, steps: int) -> list[RequestOutput]:
        """``steps`` greedy decode steps at once (see ``decode_burst``); one delta per request."""
        new_tokens = dict.fromkeys((chunk.seq for chunk in out.chunks), 0)
        for tokens in self.parts.runner.run_decode_burst(out.chunks, steps):
            live = [
                (chunk, token)
                for chunk, token in zip(out.chunks, tokens, strict=True)
                if chunk.seq.status is SequenceStatus.RUNNING
            ]
            if not live:
                break
            step = SchedulerOutput([chunk for chunk, _ in live])
            for seq in self.scheduler.postprocess(step, [token for _, token in live]):
                new_tokens[seq] += 1
            self._counters["steps"] += 1
        self._counters["generated_tokens"] += sum(new_tokens.values())
        return [self._delta(seq, count) for seq, count in new_tokens.items() if count]

    def _drain_inbox(self) -> list[RequestOutput]:
        outputs = []
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, AbortRequest):
                outputs += self._abort_now(item.request_id)
            else:
                self._sequences[item.request_id] = item
                self._counters["prompt_tokens"] += len(item.prompt_token_ids)
                self.scheduler.add(item)
        return outputs

    def _abort_now(self, request_id: str) -> list[RequestOutput]:
        seq = self._sequences.get(request_id)
        if seq is None or seq.status is SequenceStatus.FINISHED:
            return []
        self.scheduler.finish(seq, FinishReason.ABORT)
        return [self._delta(seq)]

    def _delta(self, seq: Sequence, count: int = 1) -> RequestOutput:
        finished = seq.status is SequenceStatus.FINISHED
        new_tokens = seq.output_token_ids[-count:] if seq.output_token_ids else []
        if seq.finish_reason is FinishReason.ABORT:
            new_tokens = []
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs = tuple(seq.logprobs[-len(new_tokens) :]) if new_tokens else ()
        if finished:
            self._sequences.pop(seq.request_id, None)
        return RequestOutput(
            request_id=seq.request_id,
            text=seq.detokenizer.take(final=finished),
            token_ids=tuple(new_tokens),
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            usage=seq.usage() if finished else None,
            logprobs=logprobs,
        )

    def _publish(self, outputs: list[RequestOutput]) -> None:
        progress = self.scheduler.take_prefill_progress()
        if progress:
            for listener in self._prefill_listeners:
                listener(progress)
        self._fanout.publish(outputs)

    def _fail_in_flight(self) -> None:
        with self._step_lock:
            if self.async_decodes is not None:
                self.async_decodes.drop()
            seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
            outputs = []
            for seq in seqs:
                self.scheduler.finish(seq, FinishReason.ABORT)
                outputs.append(self._delta(seq))
        self._publish(outputs)

    def _prompt_token_ids(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        return check_prompt(ids, self.max_model_len, self.parts.model_config.vocab_size)

    def iter_text(self, prompt: str | list[int], params: SamplingParams) -> Iterator[str]:
        """Convenience for a terminal chat: yields text deltas of one request."""
        for output in self.add_request(prompt, params):
            if output.text:
                yield output.text
