"""``EngineActor``: one engine on one Dask worker, created with ``actor=True``.

An actor Dask frees without ``stop()`` (its key released: a control plane that died, or
one that forgot it) stops its engine thread and closes its stream when it is collected
(``weakref.finalize``): otherwise the thread would serve nobody and hold its memory.

Every method is ``async``: plain actor methods share ONE thread per Dask worker
("Dask-Actor-Threads"), so a slow call would block every other actor call; async methods
run on the worker's event loop and the engine works in its own thread. Token deltas leave
through the actor's own TCP stream (``token_stream``), not through actor calls, and so do
KV events: the control plane only calls ``kv_cache_dump`` when it connects or finds a gap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.engine_protocol import (
    Engine,
    ForwardingEngine,
    KVCacheEngine,
    PrefillProgressEngine,
    PrefixCacheResetEngine,
)
from dynask.actors.api.outputs import RequestOutput
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.runtime.engine_factory import TORCH_KINDS, EngineSpec, build_engine
from dynask.actors.runtime.kv_transfer_actor import KVTransferMethods
from dynask.actors.runtime.malloc_tuning import keep_tensor_memory
from dynask.actors.runtime.token_stream import (
    Submission,
    TokenStreamServer,
    pack_kv_dump,
    read_submission,
    routed_record,
    unpack_requests,
)
from dynask.actors.runtime.tracing import EngineSpans, worker_tracer

log = logging.getLogger(__name__)
P = ParamSpec("P")


class EngineNotStartedError(RuntimeError):
    """An actor method needs ``start()`` to have finished first."""


class EngineActor(KVTransferMethods):
    """Holds an engine and its token stream inside a Dask worker (and, with a prefill or
    decode role, a KV transfer listener: ``kv_transfer_actor``)."""

    def __init__(self, spec: EngineSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self._engine: Engine | None = None
        self._stream: TokenStreamServer | None = None
        self._info: dict[str, Any] | None = None
        self._kv_transfer = None
        self._finalizer: weakref.finalize[Any, EngineActor] | None = None
        self._open: set[str] = set()  # requests submitted and not finished
        self._spans: EngineSpans | None = None  # with the worker's TracingPlugin
        self._owners: dict[str, str] = {}  # request id -> the reader that submitted it

    async def start(self) -> dict[str, Any]:
        """Loads the engine (in a thread), opens the token stream; returns the actor's info
        (``ActorInfo.to_dict``: plain data on the wire)."""
        if self._info is not None:
            return self._info
        if self.spec.kind in TORCH_KINDS:
            _share_cores_with_other_workers()
            _hand_the_gil_over_sooner()
        _stop_worker_profiler()
        keep_tensor_memory()
        engine = await asyncio.to_thread(build_engine, self.spec)
        stream = TokenStreamServer(asyncio.get_running_loop(), _weakly(self._reader_left))
        address = await stream.start(_worker_host())
        engine.add_output_listener(stream.publish)
        engine.add_output_listener(_weakly(self._forget_finished))
        tracer = worker_tracer()
        if tracer is not None:
            self._spans = EngineSpans(tracer, self.name)
            engine.add_output_listener(self._spans.on_outputs)
        has_kv_cache = isinstance(engine, KVCacheEngine)
        if has_kv_cache:
            stream.watch_kv_events(engine.kv_events)
        if isinstance(engine, PrefillProgressEngine):
            engine.add_prefill_listener(stream.publish_prefill)
        if isinstance(engine, ForwardingEngine):
            engine.add_lost_listener(_weakly(self._engine_lost))
        engine.start()
        self._engine, self._stream = engine, stream
        self._finalizer = weakref.finalize(
            self, _release, self.name, engine, stream, asyncio.get_running_loop()
        )
        self._info = ActorInfo(
            name=self.name,
            stream_address=address,
            max_model_len=engine.max_model_len,
            engine=self.spec.kind,
            model=self.spec.model,
            worker=_worker_address(),
            kv_events=has_kv_cache,  # False: route with the approximate index
            kv_block_size=engine.kv_block_size if isinstance(engine, KVCacheEngine) else None,
            kv_cache_tokens=_kv_cache_tokens(engine),
            kv_protected_share=float(getattr(engine, "kv_protected_share", 0.0)),
            tokenizer_files=await asyncio.to_thread(_tokenizer_files, engine),
            sampling_defaults=dict(getattr(engine, "sampling_defaults", {})),
            shares_prefill_routings=True,
        ).to_dict()
        return self._info

    async def submit(self, packed: bytes) -> None:
        """Queues a request made by ``token_stream.pack_request``.

        Bad input raises ``ValueError`` (re-raised at the caller with its message).
        """
        submission = read_submission(packed)
        request_id, prompt, params, traceparent = submission.request
        self._traced(request_id, traceparent, len(prompt))
        try:
            self._running().add_request(prompt, SamplingParams(**params), request_id)
        except BaseException:
            if self._spans is not None:
                self._spans.forget(request_id)
            raise
        self._opened(request_id, submission.owner)
        self._publish_routed([submission])

    async def submit_batch(self, payload: bytes) -> list[str | None]:
        """Queues several requests (``token_stream.pack_requests``) in one call.

        Returns one entry per request: None when queued, else the message of the
        ``ValueError`` that refused it (bad input never fails the others).
        """
        engine = self._running()
        errors: list[str | None] = []
        queued = []
        for packed in unpack_requests(payload):
            request_id = None
            try:
                submission = read_submission(packed)
                request_id, prompt, params, traceparent = submission.request
                self._traced(request_id, traceparent, len(prompt))
                engine.add_request(prompt, SamplingParams(**params), request_id)
            except (ValueError, TypeError) as exc:
                if self._spans is not None and request_id is not None:
                    self._spans.forget(request_id)
                errors.append(str(exc) or type(exc).__name__)
            else:
                self._opened(request_id, submission.owner)
                queued.append(submission)
                errors.append(None)
        self._publish_routed(queued)
        return errors

    def _traced(self, request_id: str, traceparent: str | None, prompt_tokens: int) -> None:
        if self._spans is not None and traceparent:
            self._spans.arrived(request_id, traceparent, prompt_tokens)

    def _opened(self, request_id: str, owner: str | None) -> None:
        self._open.add(request_id)
        if owner is not None:
            self._owners[request_id] = owner

    def _publish_routed(self, queued: list[Submission]) -> None:
        """Tells every reader what the routers of these queued requests noted, so other
        control planes count them (``token_stream``'s ``"routed"``). Called on the loop
        before any of their deltas can be written: those hop here from the engine thread."""
        records = [record for s in queued if (record := routed_record(s)) is not None]
        if self._stream is not None:
            self._stream.publish_routed(records)

    def _forget_finished(self, outputs: list[RequestOutput]) -> None:
        """Engine thread: finished requests leave ``_open`` (set and dict operations hold
        the GIL)."""
        for output in outputs:
            if output.finished:
                self._open.discard(output.request_id)
                self._owners.pop(output.request_id, None)

    def _reader_left(self, reader: str | None, last: bool) -> None:
        """A token-stream reader left (its control plane died or closed): the open
        requests it owned (all of them, if it was the last reader) have nobody to deliver
        to, so each is aborted now and its KV blocks freed."""
        if self._engine is None:
            return
        unread = [
            request_id
            for request_id in list(self._open)
            if last or (reader is not None and self._owners.get(request_id) == reader)
        ]
        if not unread:
            return
        log.warning(
            "engine actor %s: reader %s left; aborting its %d requests",
            self.name,
            reader or "(unnamed)",
            len(unread),
        )
        for request_id in unread:
            self._abort_remote_prefill(request_id)
            self._engine.abort(request_id)
            self._open.discard(request_id)
            self._owners.pop(request_id, None)
        if self._stream is not None:
            self._stream.forget_routed(unread)

    def _engine_lost(self, reason: str) -> None:
        """Engine thread: the engine's server is gone. The token stream closes, as when a
        worker dies, so the control plane moves this actor's requests elsewhere and the
        reconciler replaces the actor."""
        log.warning("engine actor %s lost its engine (%s); closing its stream", self.name, reason)
        stream = self._stream
        if stream is not None:
            stream.close_soon()

    async def abort(self, request_id: str) -> None:
        if self._spans is not None:
            self._spans.forget(request_id)
        self._abort_remote_prefill(request_id)
        self._running().abort(request_id)

    async def stats(self) -> dict[str, Any]:
        return self._running().stats().to_dict()

    async def kv_cache_dump(self) -> bytes:
        """The engine's whole prefix cache (``token_stream.pack_kv_dump``), for a router
        that has just connected or missed KV events. Built in a thread, under the engine's
        step lock: consistent with the event ids, and the worker's loop never waits."""
        engine = self._running()
        if not isinstance(engine, KVCacheEngine):
            raise TypeError(
                f"engine actor {self.name} runs out={self.spec.kind}, which has no prefix "
                "cache to dump; route it with the approximate index (its info's kv_events is False)"
            )
        return pack_kv_dump(await asyncio.to_thread(engine.kv_cache_dump))

    async def reset_prefix_cache(self) -> dict[str, Any]:
        """Empties the engine's prefix cache: ``{"reset": bool, "reason": str | None}``,
        the reason when it did not (requests hold blocks; an engine without a prefix
        cache it can empty), and with KV events ``event_id``: a router whose index has
        applied it has forgotten the blocks. In a thread: the engine takes its step lock."""
        engine = self._running()
        if not isinstance(engine, PrefixCacheResetEngine):
            reason = f"out={self.spec.kind} has no prefix cache this actor can empty"
            return {"reset": False, "reason": reason}
        try:
            done = await asyncio.to_thread(engine.reset_prefix_cache)
        except ValueError as exc:
            return {"reset": False, "reason": str(exc)}
        if not done:
            return {"reset": False, "reason": "requests hold KV blocks; retry once they finish"}
        answer: dict[str, Any] = {"reset": True, "reason": None}
        if isinstance(engine, KVCacheEngine):  # the routers have heard once past this id
            answer["event_id"] = (await asyncio.to_thread(engine.kv_cache_dump)).last_event_id
        return answer

    async def health(self) -> dict[str, Any]:
        return {"name": self.name, "started": self._engine is not None}

    async def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()  # stopped here: nothing left for collection to do
        await self._close_kv_transfer()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.shutdown)
        if self._stream is not None:
            await self._stream.close()
        self._engine = self._stream = None
        self._info = None

    def _running(self) -> Engine:
        if self._engine is None:
            raise EngineNotStartedError(f"engine actor {self.name} has not started")
        return self._engine


def _weakly(method: Callable[P, None]) -> Callable[P, None]:
    """``method`` through a weak reference: the engine thread and the stream server must
    not keep the actor alive, or an actor Dask freed would never be collected."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]

    def call(*args: P.args, **kwargs: P.kwargs) -> None:
        bound = ref()
        if bound is not None:
            bound(*args, **kwargs)

    return call


def _release(
    name: str, engine: Engine, stream: TokenStreamServer, loop: asyncio.AbstractEventLoop
) -> None:
    """What ``stop`` does, for an actor collected without it (must not block the collector:
    the engine joins its thread in a thread of its own)."""
    log.warning("engine actor %s was freed without stop(); stopping its engine", name)
    threading.Thread(target=engine.shutdown, name=f"release-{name}", daemon=True).start()
    if not loop.is_closed():
        loop.call_soon_threadsafe(lambda: loop.create_task(stream.close()))


def _worker_address() -> str:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:
        return "local"


def _worker_host() -> str:
    """The host the worker listens on (so the control plane can reach the stream there)."""
    from distributed.comm.addressing import get_address_host, parse_address

    address = _worker_address()
    if "://" not in address or parse_address(address)[0] not in ("tcp", "tls", "ucx", "ucxx"):
        return "127.0.0.1"  # an in-process worker: same host as its caller
    return str(get_address_host(address))


def _share_cores_with_other_workers() -> None:
    """Gives torch this worker's thread count, so N workers on one host don't oversubscribe."""
    from distributed import get_worker

    try:
        threads = get_worker().state.nthreads
    except ValueError:
        return
    import torch

    torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))


ENGINE_SWITCH_INTERVAL_S = 0.0005  # Python's default is 0.005


def _hand_the_gil_over_sooner() -> None:
    """Shortens Python's GIL switch interval in this worker process. The engine thread
    hands each step's deltas to the worker's event loop (``TokenStreamServer.publish``),
    which then needs the GIL while the engine thread runs the step's Python (postprocess,
    detokenizing, scheduling): with the default 5 ms the loop waited up to a switch
    interval, so the hand-off's gaps reached p99 18.5 ms and max 48 ms at 16 streams on
    the H200 with 5.1 ms steps, and 5.5 / 5.5 ms at 0.5 ms (``bench.serving.
    stream_handoff_probe``, 2026-12-01; 1 stream: 4.9 ms either way). The cost is more
    frequent switches between the process's Python threads."""
    if sys.getswitchinterval() > ENGINE_SWITCH_INTERVAL_S:
        sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)


def _stop_worker_profiler() -> None:
    """Stops the Dask worker's statistical profiler (``distributed.worker.profile``): every
    10 ms it walks every thread's stack on the worker's event loop, the engine thread's
    included, holding the GIL the engine and the actor calls need. On the issue-21 trace
    (mocker actors) it was ~10% of a worker's Python time; the dashboard's worker profile
    is what is lost. A worker without a profiler (or no worker: in-process) is left as is."""
    from distributed import get_worker

    try:
        callbacks = get_worker().periodic_callbacks
    except ValueError:
        return
    for name in ("profile", "profile-cycle"):
        callback = callbacks.get(name)
        if callback is not None:
            callback.stop()


def _tokenizer_files(engine: Engine) -> dict[str, bytes]:
    """The engine's tokenizer as files, so the control plane never needs the weights."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return {}
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def _kv_cache_tokens(engine: Engine) -> int | None:
    """The engine's KV cache in tokens, for routers that model it (None: unknown): what
    the engine says (``kv_cache_tokens``: a forwarding engine's server), else its blocks."""
    if hasattr(engine, "kv_cache_tokens"):
        declared = engine.kv_cache_tokens
        return declared if isinstance(declared, int) and declared > 0 else None
    block_size = getattr(engine, "kv_block_size", None)
    blocks = engine.stats().num_kv_blocks
    if not isinstance(block_size, int) or block_size < 1 or blocks < 1:
        return None
    return blocks * block_size
