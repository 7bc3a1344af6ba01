"""``out=python:FILE.py``: the user's own ``async def generate(request)`` as an engine.

Design decisions (after Dynamo's ``pystr`` / ``pytok`` engines):

- The file defines an async generator function ``generate(request)``; ``request`` is a
  ``GenerateRequest``. Each item it yields becomes one delta: a ``str`` is output text
  ("pystr"); an ``int`` or a list of ints are token ids ("pytok"), detokenized here.
  A text item counts as one generated token (for ``max_tokens`` and ``usage``): the
  user's generator decides the granularity of its text.
- The stop rules are the built-in engine's (``backend_kit.RequestProgress``). When the
  request ends early (``max_tokens``, a stop string or token) the generator is closed, so
  its ``finally`` blocks run. Returning ends the request with ``stop``.
- Every request is a task on one asyncio loop in the engine's own thread; ``abort``
  cancels the task. An exception in the user's code ends only that request, with
  ``abort`` and the error in ``RequestOutput.error``, and is logged with its traceback.
- Loading fails early and clearly: a missing file, a file without ``generate``, or a
  ``generate`` that is not an ``async def`` with ``yield``.
- Deltas are published as they are produced: one listener call per yielded item.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import logging
import threading
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

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
    start_loop_thread,
    stop_loop_thread,
)
from dynask.kv.events import KVEventLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateRequest:
    """What the user's ``generate`` receives."""

    prompt_token_ids: list[int]
    prompt_text: str  # the prompt decoded, special tokens (chat template) included
    params: SamplingParams
    request_id: str


GenerateFn = Callable[[GenerateRequest], AsyncGenerator[object, None]]


def load_generate(path: str | Path) -> GenerateFn:
    """The ``generate`` async generator function defined in the Python file ``path``."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"python engine file '{path}' does not exist")
    spec = importlib.util.spec_from_file_location(f"dynask_user_engine_{uuid.uuid4().hex}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"python engine file '{path}' cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generate = getattr(module, "generate", None)
    if generate is None:
        raise ValueError(
            f"python engine file '{path}' defines no 'generate'; "
            "define `async def generate(request):` that yields str or token ids"
        )
    if not inspect.isasyncgenfunction(generate):
        raise ValueError(
            f"'generate' in python engine file '{path}' is not an async generator function; "
            "define it as `async def generate(request):` with `yield` in its body"
        )
    return cast(GenerateFn, generate)


class PythonEngine:
    """Runs a user's ``generate`` per request; implements ``engine_protocol.Engine``."""

    def __init__(
        self, generate: GenerateFn, tokenizer: Any, max_model_len: int = DEFAULT_MAX_MODEL_LEN
    ) -> None:
        if max_model_len < 2:
            raise ValueError(
                f"PythonEngine 'max_model_len' has value {max_model_len!r}; "
                "expected an integer >= 2"
            )
        self.generate = generate
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.kv_events = KVEventLog()
        self._fanout = OutputFanout()
        self._loop = asyncio.new_event_loop()
        self._tasks: dict[str, asyncio.Task[None]] = {}  # touched on the loop thread only
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._counters = {"steps": 0, "generated_tokens": 0, "prompt_tokens": 0}

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Any, **kwargs: Any) -> PythonEngine:
        """An engine serving the ``generate`` of the Python file ``path``."""
        return cls(load_generate(path), tokenizer, **kwargs)

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Starts ``generate`` for the prompt; deltas arrive on the stream and listeners."""
        if self._loop.is_closed():
            raise RuntimeError("the python engine was shut down; it takes no more requests")
        refuse_structured_output(params, "python")
        ids = check_prompt(prompt, self.max_model_len, len(self.tokenizer))
        request_id = request_id or uuid.uuid4().hex
        progress = RequestProgress.start(
            request_id, ids, params, self.tokenizer, self.max_model_len
        )
        stream = self._fanout.open_stream(request_id, len(ids))
        self._loop.call_soon_threadsafe(self._spawn, progress)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancels the request's task; it ends with ``abort``. Unknown ids are ignored."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel, request_id)

    def add_output_listener(self, listener: OutputListener) -> None:
        """``listener`` gets each delta, on the engine thread, as soon as it is produced."""
        self._fanout.add_listener(listener)

    def stats(self) -> EngineStats:
        """Load only: a python engine has no KV cache."""
        return EngineStats.load_only(
            len(self._tasks),
            self._counters["steps"],
            self._counters["prompt_tokens"],
            self._counters["generated_tokens"],
        )

    def start(self) -> None:
        """Runs the asyncio loop in its own thread until ``shutdown`` (idempotent)."""
        self._thread = start_loop_thread(
            self._loop, self._thread, self._run_loop, "dynask-python", "python"
        )

    def shutdown(self) -> None:
        """Cancels every request (no final deltas), stops the loop and its thread."""
        stop_loop_thread(self._loop, self._thread, self._cancel_all)
        self._thread = None

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    def _spawn(self, progress: RequestProgress) -> None:
        self._counters["prompt_tokens"] += len(progress.prompt_token_ids)
        task = self._loop.create_task(self._serve(progress))
        self._tasks[progress.request_id] = task

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _cancel_all(self) -> None:
        self._stopping = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, progress: RequestProgress) -> None:
        try:
            await self._generate_into(progress)
            if not progress.finished:  # the generator returned: a natural end
                progress.finish(FinishReason.STOP)
                self._publish(progress.delta())
        except asyncio.CancelledError:
            if self._stopping:
                raise
            progress.finish(FinishReason.ABORT)
            self._publish(progress.delta())
        except Exception as exc:
            log.exception("python engine: generate() failed for request %s", progress.request_id)
            progress.finish(FinishReason.ABORT)
            self._publish(progress.delta(error=f"{type(exc).__name__}: {exc}"))
        finally:
            self._tasks.pop(progress.request_id, None)

    async def _generate_into(self, progress: RequestProgress) -> None:
        """Feeds yielded items to ``progress`` until the generator ends or the request does."""
        request = GenerateRequest(
            prompt_token_ids=list(progress.prompt_token_ids),
            prompt_text=self.tokenizer.decode(progress.prompt_token_ids, skip_special_tokens=False),
            params=progress.params,
            request_id=progress.request_id,
        )
        async with contextlib.aclosing(self.generate(request)) as items:
            async for item in items:
                delta = self._apply(progress, item)
                if delta.text or delta.token_ids or delta.finished:
                    self._publish(delta)
                if delta.finished:
                    return

    def _apply(self, progress: RequestProgress, item: object) -> RequestOutput:
        if isinstance(item, str):
            progress.push_text(item)
            return progress.delta()
        accepted: list[int] = []
        for token in self._token_ids(item):
            if progress.finished:
                break
            progress.push_token(token)
            accepted.append(token)
        return progress.delta(tuple(accepted))

    def _token_ids(self, item: object) -> list[int]:
        tokens = [item] if isinstance(item, int) else item
        vocab_size = len(self.tokenizer)
        if isinstance(tokens, list | tuple) and all(_is_token(t, vocab_size) for t in tokens):
            return [int(t) for t in tokens]
        raise TypeError(
            f"generate() yielded {item!r} of type {type(item).__name__}; yield a str (text), "
            f"or an int or a list of ints in [0, {vocab_size}) (token ids)"
        )

    def _publish(self, output: RequestOutput) -> None:
        self._counters["steps"] += 1
        if output.usage is not None:
            self._counters["generated_tokens"] += output.usage.completion_tokens
        self._fanout.publish([output])


def _is_token(value: object, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size
