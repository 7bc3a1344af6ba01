"""``out=openai:URL``: an engine whose model runs on an OpenAI-compatible server elsewhere.

Design decisions:

- Every request is a task on one asyncio loop in the engine's own thread; the task
  streams one ``/v1/completions`` request (``wire``) over a pooled ``httpx.AsyncClient``
  and turns each event into one delta. ``abort`` cancels the task, which closes the HTTP
  stream: vLLM aborts a request whose client went away and frees its blocks.
- A request that ends here first (a stop string, ``max_tokens``) closes the stream the
  same way; one the server ends is read to its usage event, so ``cached_tokens`` is the
  server's own count (vLLM sends it with ``--enable-prompt-tokens-details``).
- Losing the server is not a failed request: when a stream breaks (connection refused,
  reset, closed mid-response) and the server then does not answer ``GET /v1/models``,
  the engine is *lost*. It publishes nothing more for its requests, refuses new ones
  (``UpstreamLostError``, not a ``ValueError``: it is no fault of the request) and tells
  its lost-listeners once; the engine actor then closes its token stream, which is how
  the control plane learns that an actor is gone: its requests migrate to another actor
  and the reconciler replaces it. A server that answers after a broken stream only
  fails that one request (``abort``, with the reason in ``error``).
- A wedged server (connection open, nothing sent) is caught by the actor heartbeat's
  stall check: requests open and ``num_steps`` (events received) frozen.
- KV events: without ``kv_events_endpoint`` the engine is no ``KVCacheEngine`` and the
  router places its prompts with the approximate index. With it, ``OpenAIForwardKVEngine``
  subscribes to the server's ZMQ publisher with ``out=vllm``'s own subscriber and mirror
  (``vllm.kv_events``), so its cache is followed exactly like a local vLLM's. Decoding
  vLLM's events needs vLLM's Python package where the actor runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from dynask.actors.api.outputs import FinishReason, RequestOutput, TokenLogprob, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.api.streams import RequestStream
from dynask.actors.backends.backend_kit import (
    OutputFanout,
    OutputListener,
    RequestProgress,
    check_prompt,
    start_loop_thread,
    stop_loop_thread,
)
from dynask.actors.backends.openai_forward.args import ForwardArgs, api_base
from dynask.actors.backends.openai_forward.upstream import (
    UpstreamInfo,
    UpstreamUnavailableError,
    auth_headers,
    check_tokenizer,
    context_length,
    error_of,
    probe,
    reachable,
)
from dynask.actors.backends.openai_forward.wire import (
    Chunk,
    UpstreamError,
    completion_body,
    parse_event,
    refusal,
)
from dynask.kv.events import KVEventLog
from dynask.kv.prefix_index import KVCacheDump

log = logging.getLogger(__name__)

LostListener = Callable[[str], None]
_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class UpstreamLostError(RuntimeError):
    """The engine's server is gone; the request belongs on another actor."""


class OpenAIForwardEngine:
    """Forwards requests to one OpenAI-compatible server; implements ``Engine`` and
    ``ForwardingEngine`` (``engine_protocol``)."""

    def __init__(self, url: str, args: ForwardArgs, tokenizer: Any) -> None:
        self.base = api_base(url)
        self.args = args
        self.tokenizer = tokenizer
        headers = auth_headers(args.api_key_env)
        with httpx.Client(timeout=args.connect_timeout_s, headers=headers) as client:
            self.upstream: UpstreamInfo = probe(client, self.base, args.upstream_model)
            check_tokenizer(client, self.base, self.upstream.model, tokenizer)
        self.max_model_len = context_length(args.max_model_len, self.upstream.max_model_len)
        self.kv_events = KVEventLog()
        self.lost_reason: str | None = None
        self._headers = headers
        self._fanout = OutputFanout()
        self._lost_listeners: list[LostListener] = []
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None  # made on the loop
        self._tasks: dict[str, asyncio.Task[None]] = {}  # touched on the loop thread only
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._counters = dict.fromkeys(
            ("steps", "prompt_tokens", "generated_tokens", "queried", "hits"), 0
        )

    # ---- the engine protocol ----------------------------------------------------------

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Starts forwarding the prompt; deltas arrive on the stream and the listeners."""
        if self._loop.is_closed():
            raise RuntimeError("the out=openai engine was shut down; it takes no more requests")
        if self.lost_reason is not None:
            raise UpstreamLostError(f"out=openai:{self.base} is lost: {self.lost_reason}")
        refused = refusal(params)
        if refused is not None:
            raise ValueError(refused)
        ids = check_prompt(prompt, self.max_model_len, len(self.tokenizer))
        request_id = request_id or uuid.uuid4().hex
        progress = RequestProgress.start(
            request_id, ids, params, self.tokenizer, self.max_model_len
        )
        stream = self._fanout.open_stream(request_id, len(ids))
        self._loop.call_soon_threadsafe(self._spawn, progress)
        return stream

    def abort(self, request_id: str) -> None:
        """Closes the request's HTTP stream (the server aborts it); unknown ids: ignored."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel, request_id)

    def add_output_listener(self, listener: OutputListener) -> None:
        self._fanout.add_listener(listener)

    def add_lost_listener(self, listener: LostListener) -> None:
        """``listener(reason)`` is called once, on the engine thread, if the server is lost."""
        self._lost_listeners.append(listener)

    @property
    def kv_cache_tokens(self) -> int | None:
        """The server's KV cache in tokens, from its metrics (None: it does not say)."""
        upstream = self.upstream
        if upstream.block_size is None or upstream.num_kv_blocks < 1:
            return None
        return upstream.num_kv_blocks * upstream.block_size

    def stats(self) -> EngineStats:
        """This engine's own requests and counters (the server may serve others too)."""
        counters = self._counters
        return replace(
            EngineStats.load_only(
                len(self._tasks),
                counters["steps"],
                counters["prompt_tokens"],
                counters["generated_tokens"],
            ),
            prefix_queried_tokens=counters["queried"],
            prefix_hit_tokens=counters["hits"],
        )

    def start(self) -> None:
        """Runs the loop in its own thread until ``shutdown`` (idempotent)."""
        self._thread = start_loop_thread(
            self._loop, self._thread, self._run_loop, "dynask-openai", "out=openai"
        )

    def shutdown(self) -> None:
        """Closes every request's stream (no final deltas), the client, the loop."""
        stop_loop_thread(self._loop, self._thread, self._close)
        self._thread = None

    # ---- the loop thread ----------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        limits = httpx.Limits(max_connections=self.args.max_connections)
        timeout = httpx.Timeout(self.args.read_timeout_s, connect=self.args.connect_timeout_s)
        self._client = httpx.AsyncClient(headers=self._headers, timeout=timeout, limits=limits)
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    async def _close(self) -> None:
        self._stopping = True
        await self._cancel_all()
        if self._client is not None:
            await self._client.aclose()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, progress: RequestProgress) -> None:
        self._counters["prompt_tokens"] += len(progress.prompt_token_ids)
        self._tasks[progress.request_id] = self._loop.create_task(self._serve(progress))

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _serve(self, progress: RequestProgress) -> None:
        try:
            await self._forward(progress)
        except asyncio.CancelledError:
            if self._stopping or self.lost_reason is not None:
                return  # no final delta: shut down, or moving to another actor
            progress.finish(FinishReason.ABORT)
            self._publish_final(progress, ())
        except httpx.TransportError as exc:
            await self._broken_stream(progress, exc)
        except (UpstreamError, httpx.HTTPError) as exc:
            log.warning("out=openai:%s failed request %s: %s", self.base, progress.request_id, exc)
            progress.finish(FinishReason.ABORT)
            self._publish_final(progress, (), error=f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(progress.request_id, None)

    async def _broken_stream(self, progress: RequestProgress, exc: httpx.TransportError) -> None:
        """A stream that broke: the server is lost, or only this request failed."""
        if self.lost_reason is None:
            assert self._client is not None
            if await reachable(self._client, self.base, self.args.connect_timeout_s):
                progress.finish(FinishReason.ABORT)
                error = f"the stream from {self.base} broke: {type(exc).__name__}: {exc}"
                self._publish_final(progress, (), error=error)
                return
            self._lose(f"the server stopped answering ({type(exc).__name__}: {exc})")

    def _lose(self, reason: str) -> None:
        """Once: no more deltas from this engine, and the lost-listeners hear why."""
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        log.warning("out=openai:%s is lost: %s; its requests move elsewhere", self.base, reason)
        current = asyncio.current_task()
        for task in self._tasks.values():
            if task is not current:
                task.cancel()
        for listener in self._lost_listeners:
            listener(reason)

    async def _forward(self, progress: RequestProgress) -> None:
        """Streams the server's answer into ``progress`` and publishes it, end included."""
        assert self._client is not None
        params = progress.params
        room = progress.max_model_len - len(progress.prompt_token_ids)
        body = completion_body(
            self.upstream.model, progress.prompt_token_ids, params, min(params.max_tokens, room)
        )
        ended: FinishReason | None = None  # how the server ended it
        usage: Chunk | None = None
        pending: tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None] = ((), None)
        url = f"{self.base}/completions"
        async with self._client.stream("POST", url, json=body) as response:
            if not response.is_success:
                answer = await response.aread()
                raise UpstreamError(f"{response.status_code} from {url}: {error_of(answer)}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                chunk = parse_event(line.removeprefix("data:"), params.logprobs)
                if chunk is None:
                    break
                self._counters["steps"] += 1
                if chunk.prompt_tokens is not None:
                    usage = chunk
                    continue
                step = self._apply(progress, chunk)
                if chunk.finish_reason is not None:
                    ended = _FINISH_REASONS.get(chunk.finish_reason)
                    if ended is None:  # vLLM's "abort", or a reason we do not know
                        raise UpstreamError(f"the server ended the request: {chunk.finish_reason}")
                if progress.finished or ended is not None:
                    pending = step  # the final delta carries them
                    if ended is None:
                        break  # ended here first (a stop string): closing aborts it there
                elif step[0] or step[1] or chunk.text:
                    self._publish_step(progress, step)
        if not progress.finished:
            progress.finish(ended or FinishReason.STOP)
        self._note_usage(progress, usage)
        self._publish_final(progress, *pending, cached_tokens=usage.cached_tokens if usage else 0)

    def _apply(
        self, progress: RequestProgress, chunk: Chunk
    ) -> tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None]:
        """Feeds one event to ``progress``; the token ids and logprobs it accepted."""
        if chunk.token_ids is None:
            if chunk.text and not progress.finished:
                progress.push_text(chunk.text)
            return (), None
        accepted: list[int] = []
        for token in chunk.token_ids:
            if progress.finished:
                break
            progress.push_token(token)
            accepted.append(token)
        logprobs = None if chunk.logprobs is None else chunk.logprobs[: len(accepted)]
        return tuple(accepted), logprobs

    def _note_usage(self, progress: RequestProgress, usage: Chunk | None) -> None:
        self._counters["generated_tokens"] += progress.num_generated
        if usage is not None and usage.cached_tokens:
            self._counters["queried"] += len(progress.prompt_token_ids)
            self._counters["hits"] += usage.cached_tokens

    def _publish_step(
        self,
        progress: RequestProgress,
        step: tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None],
    ) -> None:
        token_ids, logprobs = step
        text = progress.detokenizer.take()
        self._fanout.publish(
            [RequestOutput(progress.request_id, text, token_ids, logprobs=logprobs)]
        )

    def _publish_final(
        self,
        progress: RequestProgress,
        token_ids: tuple[int, ...],
        logprobs: tuple[TokenLogprob, ...] | None = None,
        error: str | None = None,
        cached_tokens: int = 0,
    ) -> None:
        usage = Usage(len(progress.prompt_token_ids), progress.num_generated, cached_tokens)
        if progress.params.logprobs is not None:
            logprobs = logprobs or ()
        delta = replace(progress.delta(token_ids, error), usage=usage, logprobs=logprobs)
        self._fanout.publish([delta])


class OpenAIForwardKVEngine(OpenAIForwardEngine):
    """``OpenAIForwardEngine`` that follows the server's KV events (a ``KVCacheEngine``)."""

    def __init__(self, url: str, args: ForwardArgs, tokenizer: Any) -> None:
        from dynask.actors.backends.vllm.kv_events import KVCacheMirror, KVEventSubscriber

        super().__init__(url, args, tokenizer)
        block_size = args.block_size or self.upstream.block_size
        if block_size is None:
            raise ValueError(
                f"out=openai:{self.base} does not report its KV block size (vLLM's "
                "vllm:cache_config_info metric); give it as the engine argument block_size"
            )
        if self.upstream.block_size not in (None, block_size):
            raise ValueError(
                f"ForwardArgs 'block_size' has value {block_size!r}, but the server's KV "
                f"blocks hold {self.upstream.block_size} tokens"
            )
        self.kv_block_size: int = block_size
        self._mirror = KVCacheMirror(self.kv_events)
        assert args.kv_events_endpoint is not None
        self._subscriber = KVEventSubscriber(args.kv_events_endpoint, self._mirror)
        self._subscriber.start()

    def kv_cache_dump(self) -> KVCacheDump:
        """The server's prefix cache as mirrored from the events since we subscribed."""
        return self._mirror.dump()

    def stats(self) -> EngineStats:
        return replace(
            super().stats(),
            num_kv_blocks=self.upstream.num_kv_blocks,
            num_free_kv_blocks=self.upstream.num_kv_blocks,  # the server's usage is not read
            num_cached_kv_blocks=self._mirror.num_blocks,
        )

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._subscriber.close()


def build_forward_engine(url: str, args: ForwardArgs, tokenizer: Any) -> OpenAIForwardEngine:
    """The engine for ``out=openai:URL``: following KV events if their endpoint is given."""
    try:
        if args.kv_events_endpoint is not None:
            return OpenAIForwardKVEngine(url, args, tokenizer)
        return OpenAIForwardEngine(url, args, tokenizer)
    except UpstreamUnavailableError:
        raise
    except httpx.HTTPError as exc:
        raise UpstreamUnavailableError(f"out=openai:{url} did not answer: {exc}") from exc
