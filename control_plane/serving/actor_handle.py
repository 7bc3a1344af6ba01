"""The control plane's side of one engine actor: its Dask proxy and its token stream.

One TCP connection per actor carries the deltas of all its requests; a reader task
dispatches each delta to the queue of the request it belongs to. A request's deltas are
consumed by ``generate``; a client that goes away aborts its request on the actor. The
same connection carries the actor's KV events, handed to the ``listener`` (the model's
``kv_sync.ActorKVSync``), which also hears when the stream breaks. ``load`` counts the
blocks of the requests in flight, for the router; ``peer_load`` those of the requests
other control planes routed there, from the notes the actor passes on (``"routed"``
frames, ``routing.peer_routings``) and the deltas every reader gets.

The actor's own reports cross here once, typed: ``info`` is an ``ActorInfo``, ``stats``
the latest ``EngineStats`` (None until the first refresh). Nothing past this module
reads them by string key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.api.outputs import RequestOutput
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.stats import EngineStats
from dynask.actors.runtime.token_stream import (
    KIND_HELLO,
    KIND_KV_EVENTS,
    KIND_OUTPUTS,
    KIND_PREFILL,
    KIND_ROUTED,
    KIND_ROUTED_ENDED,
    decode_output,
    encode_frame,
    pack_request,
    read_frame,
)
from dynask.actors.runtime.tracing import attached
from dynask.control_plane.routing.peer_routings import (
    PeerRouting,
    RoutingNote,
    read_peer_routings,
)
from dynask.control_plane.serving.actor_load import DEFAULT_BLOCK_SIZE, ActorLoad
from dynask.control_plane.serving.submit_batcher import SubmitBatcher
from dynask.control_plane.state.deployment import Role

log = logging.getLogger(__name__)

SUBMIT_WAIT_S = 30.0  # how long a cancelled request waits to learn whether it was submitted
CALL_TIMEOUT_S = 10.0  # stats and abort calls: a hung worker must not hang their callers


class ActorUnavailableError(RuntimeError):
    """The actor's stream broke or the actor cannot be reached."""


class StreamListener(Protocol):
    """Who follows an actor's KV events (``kv_sync.ActorKVSync``)."""

    def on_kv_events(self, payload: Any) -> None: ...

    def on_stream_closed(self) -> None: ...


@dataclass
class ActorHandle:
    """An engine actor as the router sees it: identity, limits and live load."""

    name: str
    deployment: str
    proxy: Any  # distributed.Actor
    info: ActorInfo
    stats: EngineStats | None = None  # the latest ``refresh_stats``
    listener: StreamListener | None = None
    role: Role = Role.AGGREGATED
    # Hears each request another control plane routed here (the model's routing).
    peer_listener: Callable[[PeerRouting], None] | None = None
    load: ActorLoad = field(init=False)
    peer_load: ActorLoad = field(init=False)  # other control planes' requests here
    _queues: dict[str, asyncio.Queue[RequestOutput | None]] = field(default_factory=dict)
    _reader_task: asyncio.Task[None] | None = None
    _writer: asyncio.StreamWriter | None = None
    _batcher: SubmitBatcher = field(init=False)
    broken: bool = False
    lost_reason: str | None = None  # how the loss was noticed; "stream_closed" for EOF
    # Names this control plane's connection; the owner of the requests it submits.
    reader_id: str = field(default_factory=lambda: f"cp-{os.getpid()}-{uuid.uuid4().hex[:12]}")

    def __post_init__(self) -> None:
        self.load = ActorLoad(self.info.kv_block_size or DEFAULT_BLOCK_SIZE)
        self.peer_load = ActorLoad(self.load.block_size)
        self._batcher = SubmitBatcher(self.proxy, self.name)

    @property
    def in_flight(self) -> int:
        """Requests this control plane has on the actor."""
        return len(self.load)

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def worker(self) -> str:
        return self.info.worker

    async def connect(self) -> None:
        """Opens the token stream and names this reader (``token_stream``'s hello): if this
        control plane dies, the actor aborts the requests it submitted at once. The first
        frame may be the routings other control planes made there and that are still in
        flight: give the handle its ``peer_listener`` (``ModelRouting.add_actor``) before
        awaiting anything else, or they go unheard."""
        host, port = self.info.stream_address.rsplit(":", 1)
        reader, self._writer = await asyncio.open_connection(host, int(port))
        self._writer.write(encode_frame(KIND_HELLO, {"reader": self.reader_id}))
        self._reader_task = asyncio.create_task(self._read(reader), name=f"stream-{self.name}")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                kind, payload = await read_frame(reader)
                if kind == KIND_OUTPUTS:
                    for item in payload:
                        self._dispatch(decode_output(item))
                elif kind == KIND_KV_EVENTS and self.listener is not None:
                    self.listener.on_kv_events(payload)
                elif kind in (KIND_ROUTED, KIND_ROUTED_ENDED):
                    self._peer_routed(payload)
                elif kind == KIND_PREFILL:
                    self._prefill_progress(payload)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            log.warning("token stream of %s closed: %s", self.name, exc)
        finally:
            self._mark_broken()

    def _dispatch(self, output: RequestOutput) -> None:
        queue = self._queues.get(output.request_id)
        if queue is not None:
            queue.put_nowait(output)
        elif output.request_id in self.peer_load:  # another control plane's request
            self.peer_load.advance(output.request_id, len(output.token_ids))
            if output.finished:
                self.peer_load.release(output.request_id)

    def _prefill_progress(self, payload: Any) -> None:
        """Counts down the prefill of the requests the engine advanced (``ActorLoad.
        progress``), this control plane's and its peers'. A bad frame is logged and
        skipped; the stream goes on."""
        if not isinstance(payload, dict):
            log.error("engine actor %s sent a prefill frame that is not a map; skipped", self.name)
            return
        for request_id, pending in payload.items():
            if isinstance(pending, bool) or not isinstance(pending, int):
                continue
            if request_id in self.load:
                self.load.progress(request_id, pending)
            else:
                self.peer_load.progress(request_id, pending)

    def _peer_routed(self, payload: Any) -> None:
        """Counts the requests other control planes routed here, when someone follows
        them (``peer_listener``). Their own hear theirs too: skipped by owner. A bad frame
        is logged and skipped; the stream goes on."""
        if self.peer_listener is None:
            return
        try:
            routings = read_peer_routings(payload)
        except ValueError as exc:
            log.error("engine actor %s sent %s; skipped", self.name, exc)
            return
        for routing in routings:
            if routing.owner == self.reader_id or routing.request_id in self.peer_load:
                continue
            if routing.ended:  # its blocks only: it puts no load on the actor any more
                self.peer_listener(routing)
                continue
            self.peer_load.admit(
                routing.request_id, routing.prompt_tokens, routing.note.cached_tokens
            )
            if routing.generated_tokens:  # decoding before this control plane connected
                self.peer_load.advance(routing.request_id, routing.generated_tokens)
            self.peer_listener(routing)

    def declare_lost(self, kind: str, detail: str) -> None:
        """Treats the actor as gone although its stream is open (a hung worker, or one the
        scheduler removed): every request on it is woken to move elsewhere. ``kind`` is
        how it was noticed (``lost_reason``), ``detail`` goes to the log."""
        if self.broken:
            return
        log.warning("engine actor %s is lost (%s): %s", self.name, kind, detail)
        self.lost_reason = kind
        self._mark_broken()
        self._batcher.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()

    def _mark_broken(self) -> None:
        if self.broken:
            return
        self.broken = True
        self.lost_reason = self.lost_reason or "stream_closed"
        for queue in self._queues.values():
            queue.put_nowait(None)  # wakes every waiter: its actor is gone
        if self.listener is not None:
            self.listener.on_stream_closed()

    async def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        submit: Callable[[bytes], Awaitable[None]] | None = None,
        traceparent: str | None = None,
        routed: RoutingNote | None = None,
    ) -> AsyncIterator[list[RequestOutput]]:
        """Submits a request and yields its deltas, in order, until the final one.

        Each item is every delta that had arrived by then: under load several engine steps
        arrive between two turns of the event loop, and a caller that writes them in one
        go (one SSE write, not one per token) spends much less CPU per request.

        A request counted in ``load`` (``reserve``, by whoever placed it, who also
        releases it) advances there as its tokens arrive. ``submit`` replaces the batched
        submission (``DisaggOrchestrator.submitter`` hands a disaggregated request over).
        ``traceparent`` (W3C) travels with the request: the actor's spans join its trace.
        ``routed`` (the router's note) goes to the actor's other readers: control planes
        in front of the same actor count the request as this one does.
        """
        if self.broken:
            raise ActorUnavailableError(f"engine actor {self.name} is unavailable")
        queue: asyncio.Queue[RequestOutput | None] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        submitted: asyncio.Future[None] | None = None
        try:
            packed = pack_request(
                request_id,
                prompt,
                asdict(params),
                traceparent,
                owner=self.reader_id,
                routed=None if routed is None else routed.to_wire(),
            )
            if submit is None:
                submitted = self._batcher.submit(packed)
            else:
                with attached(traceparent):  # the hand-over's spans: children of the attempt
                    submitted = asyncio.ensure_future(submit(packed))
            await self._submitted(submitted)
            while not finished:
                batch = [await queue.get()]
                while not queue.empty() and batch[-1] is not None and not batch[-1].finished:
                    batch.append(queue.get_nowait())
                if batch[-1] is None:
                    raise ActorUnavailableError(f"engine actor {self.name} went away")
                outputs = [o for o in batch if o is not None]
                finished = outputs[-1].finished
                self.load.advance(request_id, sum(len(o.token_ids) for o in outputs))
                yield outputs
        finally:
            del self._queues[request_id]
            if not finished and not self.broken and submitted is not None:
                await self._abort_if_submitted(request_id, submitted)

    async def _submitted(self, submitted: asyncio.Future[None]) -> None:
        """Waits until the actor has the request (shielded: a cancelled caller still
        learns whether it went out). The actor's ``ValueError`` (bad input) passes
        through; any other failure means the actor could not be reached."""
        try:
            await asyncio.shield(submitted)
        except ValueError:
            raise
        except Exception as exc:
            raise ActorUnavailableError(
                f"engine actor {self.name} did not take the request: {exc}"
            ) from exc

    def reserve(self, request_id: str, prompt_tokens: int, cached_tokens: int) -> None:
        """Counts a routed request in ``load`` before ``generate`` starts it, so requests
        routed meanwhile see it; its placer releases it (``load.release``)."""
        self.load.admit(request_id, prompt_tokens, cached_tokens)

    async def _abort_if_submitted(self, request_id: str, submitted: asyncio.Future[None]) -> None:
        """Aborts a request the caller gave up on, once it is surely on the actor (an abort
        that overtook its own submission would find nothing to stop)."""
        if not submitted.done():
            await asyncio.wait([submitted], timeout=SUBMIT_WAIT_S)
        if submitted.done() and not submitted.cancelled() and submitted.exception() is None:
            await self._abort_quietly(request_id)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.proxy.abort(request_id)), CALL_TIMEOUT_S)
        except Exception as exc:  # the request is gone either way; say why in the log
            log.warning("abort of %s on %s failed: %s", request_id, self.name, exc)

    async def refresh_stats(self) -> EngineStats:
        self.stats = EngineStats.from_dict(
            await asyncio.wait_for(self.proxy.stats(), CALL_TIMEOUT_S)
        )
        return self.stats

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
        self._batcher.close()
