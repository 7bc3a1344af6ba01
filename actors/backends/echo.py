"""``out=echo``: streams each prompt's tokens back, one token per request per step.

Design decisions:

- For testing the serving path without a model: routing, streaming, cancellation and
  load all behave as with a real engine, and the expected output is known (the prompt).
- A step gives every running request its next prompt token, then sleeps ``delay_s``
  (per token, not per request), so a slow model is easy to imitate. ``step()`` is
  public: tests drive the engine without its thread, as they do ``LLMEngine``.
- The stop rules are the built-in engine's (``backend_kit.RequestProgress``); the end of
  the prompt ends the request with ``stop``. EOS in the prompt is echoed like any token.
- No KV cache: ``kv_events`` stays empty and the block counts in ``stats`` are 0.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from typing import Any

from dynask.actors.api.engine_inputs import AbortRequest
from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.streams import RequestStream
from dynask.actors.backends.backend_kit import (
    DEFAULT_MAX_MODEL_LEN,
    OutputFanout,
    OutputListener,
    RequestProgress,
    check_prompt,
    refuse_structured_output,
)
from dynask.kv.events import KVEventLog

log = logging.getLogger(__name__)


class EchoEngine:
    """An engine whose output is its input; implements ``engine_protocol.Engine``."""

    def __init__(
        self, tokenizer: Any, delay_s: float = 0.0, max_model_len: int = DEFAULT_MAX_MODEL_LEN
    ) -> None:
        if not delay_s >= 0.0:
            raise ValueError(f"EchoEngine 'delay_s' has value {delay_s!r}; expected a number >= 0")
        if max_model_len < 2:
            raise ValueError(
                f"EchoEngine 'max_model_len' has value {max_model_len!r}; expected an integer >= 2"
            )
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.max_model_len = max_model_len
        self.kv_events = KVEventLog()
        self._fanout = OutputFanout()
        self._inbox: queue.SimpleQueue[RequestProgress | AbortRequest] = queue.SimpleQueue()
        self._running: dict[str, RequestProgress] = {}
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._counters = {"steps": 0, "generated_tokens": 0, "prompt_tokens": 0}

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Queues a request; its deltas arrive on the returned stream and at the listeners."""
        refuse_structured_output(params, "echo")
        ids = check_prompt(prompt, self.max_model_len, len(self.tokenizer))
        request_id = request_id or uuid.uuid4().hex
        progress = RequestProgress.start(
            request_id, ids, params, self.tokenizer, self.max_model_len
        )
        stream = self._fanout.open_stream(request_id, len(ids))
        self._inbox.put(progress)
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Ends the request with ``abort`` at the next step; unknown ids are ignored."""
        self._inbox.put(AbortRequest(request_id))
        self._wakeup.set()

    def add_output_listener(self, listener: OutputListener) -> None:
        """``listener`` gets each step's deltas on the engine thread, one call per step."""
        self._fanout.add_listener(listener)

    def stats(self) -> EngineStats:
        """Load only: an echo engine has no KV cache."""
        return EngineStats.load_only(
            len(self._running),
            self._counters["steps"],
            self._counters["prompt_tokens"],
            self._counters["generated_tokens"],
        )

    def start(self) -> None:
        """Runs the echo loop in its own thread until ``shutdown`` (idempotent)."""
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._loop, name="dynask-echo", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Stops the thread; requests in flight are dropped."""
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def step(self) -> list[RequestOutput]:
        """Takes new requests and aborts, echoes one token per running request, publishes."""
        outputs = self._drain_inbox()
        for progress in list(self._running.values()):
            outputs.append(self._advance(progress))
        if self._running or outputs:
            self._counters["steps"] += 1
        self._fanout.publish(outputs)
        return outputs

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if not self._running and self._inbox.empty():
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                self.step()
            except Exception:
                log.exception("echo step failed; aborting the requests in flight")
                self._fail_in_flight()
            if self.delay_s:
                self._stopping.wait(self.delay_s)

    def _fail_in_flight(self) -> None:
        failed = list(self._running.values())
        self._running.clear()
        for progress in failed:
            progress.finish(FinishReason.ABORT)
        self._fanout.publish([progress.delta() for progress in failed])

    def _drain_inbox(self) -> list[RequestOutput]:
        outputs = []
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, AbortRequest):
                aborted = self._running.pop(item.request_id, None)
                if aborted is not None:
                    aborted.finish(FinishReason.ABORT)
                    outputs.append(aborted.delta())
            else:
                self._running[item.request_id] = item
                self._counters["prompt_tokens"] += len(item.prompt_token_ids)
        return outputs

    def _advance(self, progress: RequestProgress) -> RequestOutput:
        token = progress.prompt_token_ids[progress.num_generated]
        progress.push_token(token)
        if progress.num_generated == len(progress.prompt_token_ids):
            progress.finish(FinishReason.STOP)
        self._counters["generated_tokens"] += 1
        if progress.finished:
            del self._running[progress.request_id]
        return progress.delta((token,))
