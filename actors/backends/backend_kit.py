"""Plumbing shared by the backends that make tokens without the built-in scheduler.

Design decisions:

- The echo and python backends have no KV cache and no batching, yet they must look
  exactly like the built-in engine at their edges: the same prompt checks and messages,
  the same stop rules (stop token ids, stop strings, ``max_tokens``, the context length),
  the same ``RequestOutput`` deltas with ``usage`` on the last one, and one listener call
  per step. ``check_prompt`` and ``RequestProgress`` give the first three; ``OutputFanout``
  the last.
- Text items (the python backend's "pystr") run through the same stop-string search as
  decoded tokens (``TextDetokenizer.push_text``), so a stop string split across items is
  still found and never streamed.
- These backends hold no KV cache, so ``cached_tokens`` is always 0.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.engine_inputs import check_prompt
from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.streams import OutputFanout, OutputListener
from dynask.actors.engine.detokenizer import IncrementalDetokenizer

__all__ = ["OutputFanout", "OutputListener", "RequestProgress", "TextDetokenizer", "check_prompt"]

DEFAULT_MAX_MODEL_LEN = 8192


class TextDetokenizer(IncrementalDetokenizer):
    """An ``IncrementalDetokenizer`` that also accepts ready-made text."""

    def push_text(self, text: str) -> None:
        """Appends output text and searches it for stop strings, as ``push`` does."""
        self.text += text
        self._check_stop()


@dataclass(eq=False)
class RequestProgress:
    """One request's output so far, and whether (and why) it has ended."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: TextDetokenizer
    max_model_len: int
    num_generated: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None

    @classmethod
    def start(
        cls,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        tokenizer: Any,
        max_model_len: int,
    ) -> RequestProgress:
        """A request with nothing generated yet."""
        detokenizer = TextDetokenizer(tokenizer, prompt, params.stop, params.skip_special_tokens)
        return cls(request_id, prompt, params, detokenizer, max_model_len)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def push_token(self, token: int) -> None:
        """Adds one generated token and applies the stop rules."""
        self.num_generated += 1
        self.detokenizer.push(token)
        if token in self.params.stop_token_ids:
            self._end(FinishReason.STOP, token)
        else:
            self._check_stop_string_or_length()

    def push_text(self, text: str) -> None:
        """Adds one text item (it counts as one generated token) and applies the stop rules."""
        self.num_generated += 1
        self.detokenizer.push_text(text)
        self._check_stop_string_or_length()

    def finish(self, reason: FinishReason) -> None:
        """Ends the request for ``reason`` unless it has already ended."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def delta(self, token_ids: tuple[int, ...] = (), error: str | None = None) -> RequestOutput:
        """The output of the latest step: new text, ``token_ids``, and the end if reached."""
        finished = self.finished
        return RequestOutput(
            request_id=self.request_id,
            text=self.detokenizer.take(final=finished),
            token_ids=token_ids,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            usage=Usage(len(self.prompt_token_ids), self.num_generated, 0) if finished else None,
            error=error,
        )

    def _check_stop_string_or_length(self) -> None:
        stopped_by = self.detokenizer.stopped_by
        if stopped_by is not None:
            self._end(FinishReason.STOP, stopped_by)
        elif self.num_generated >= min(self.params.max_tokens, self._room):
            self._end(FinishReason.LENGTH, None)

    @property
    def _room(self) -> int:
        """How many tokens fit in the context after the prompt."""
        return self.max_model_len - len(self.prompt_token_ids)

    def _end(self, reason: FinishReason, stop_reason: str | int | None) -> None:
        self.finish_reason = reason
        self.stop_reason = stop_reason


def refuse_structured_output(params: SamplingParams, engine: str) -> None:
    """``ValueError`` for a grammar-constrained request to an engine that cannot honour it
    (the control plane refuses these with a 400 before they get here)."""
    if params.structured_output is not None:
        raise ValueError(
            f"out={engine} cannot constrain its output to a grammar; structured outputs "
            "need out=torch or out=vllm"
        )


def start_loop_thread(
    loop: asyncio.AbstractEventLoop,
    thread: threading.Thread | None,
    run: Callable[[], None],
    name: str,
    engine: str,
) -> threading.Thread:
    """Starts ``run`` (which runs ``loop`` until it is stopped) in a daemon thread, once;
    returns the thread. The loop-backed engines' (python, out=openai) ``start``."""
    if loop.is_closed():
        raise RuntimeError(f"the {engine} engine was shut down and cannot start again")
    if thread is None:
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
    return thread


def stop_loop_thread(
    loop: asyncio.AbstractEventLoop,
    thread: threading.Thread | None,
    close: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """Runs ``close()`` on the loop, stops the loop, joins its thread and closes the loop
    (idempotent). The loop-backed engines' ``shutdown``."""
    if loop.is_closed():
        return
    if thread is not None:
        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
    loop.close()
