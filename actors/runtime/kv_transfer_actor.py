"""The actor methods of disaggregated prefill, mixed into ``EngineActor``.

The control plane calls them (all ``async``, see ``engine_actor``): ``open_kv_transfer``
once after ``start`` on actors with a prefill or decode role; then per request
``prepare_remote_prefill`` on the decode actor, ``prefill_remote`` on the prefill actor
with the ticket it got, and ``cancel_remote_prefill`` on the decode actor if the prefill
call failed. Requests and tickets travel as bytes (cheap for Dask to carry).

Router replicas: ``prefill_remote`` may carry the prefill router's note (``routed``: its
reader id and ``RoutingNote.to_wire``). The prefill actor then tells its token stream's
readers, as for a request submitted to it (``token_stream``'s ``"routed"``), under the id
its engine prefills with (``<request id>/prefill``, the control plane's load key), so the
other control planes count the prefill on that actor; the engine's final delta for the
id ends it, and one more final delta is published when the call returns, in case the
engine never got to emit one (a failed prefill). Readers ignore a second final delta.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import INVALID_SPAN

from dynask.actors.api.engine_protocol import Engine
from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.runtime.token_stream import (
    Submission,
    SubmittedRequest,
    TokenStreamServer,
    read_request,
    read_submission,
    routed_record,
)
from dynask.actors.runtime.tracing import context_from, worker_tracer

if TYPE_CHECKING:  # the service and the transports load torch: imported where a role needs them
    from dynask.actors.runtime.kv_transfer_service import KVTransferService


class KVTransferMethods:
    """Mixin: needs ``name``, ``spec``, ``_running()`` and ``_kv_transfer`` (set to None
    in ``__init__``) from the actor class."""

    name: str
    spec: Any
    _kv_transfer: KVTransferService | None
    _stream: TokenStreamServer | None

    def _running(self) -> Engine:
        raise NotImplementedError

    def _traced(self, request_id: str, traceparent: str | None, prompt_tokens: int) -> None:
        raise NotImplementedError

    def _publish_routed(self, queued: list[Submission]) -> None:
        raise NotImplementedError

    def _opened(self, request_id: str, owner: str | None) -> None:
        raise NotImplementedError

    def _forget_finished(self, outputs: list[RequestOutput]) -> None:
        raise NotImplementedError

    async def open_kv_transfer(self, transport: str, host: str | None = None) -> str:
        """Starts this actor's KV listener (``tcp`` or ``ucxx``); returns its address."""
        if self._kv_transfer is not None:
            return str(self._kv_transfer.address)
        from dynask.actors.runtime.engine_actor import _worker_host
        from dynask.actors.runtime.kv_transfer_service import (
            KVTransferService,
            as_llm_engine,
            has_paged_cache,
        )
        from dynask.kv.transfer import make_transport

        engine = as_llm_engine(self._running(), self.name, self.spec.kind)

        service = KVTransferService(
            engine, make_transport(transport, paged_cache=has_paged_cache(engine))
        )
        address = await service.start(host or _worker_host())
        self._kv_transfer = service
        return address

    async def prepare_remote_prefill(self, packed_request: bytes, timeout_s: float) -> bytes | None:
        """Decode side: reserves blocks for a request (``token_stream.pack_request``) whose
        prompt KV a prefill actor will send; returns the ticket for it, or None when the
        request was queued for a local prefill instead (nothing to move, or no room)."""
        submission = read_submission(packed_request)
        request_id, prompt, params, traceparent = submission.request
        self._traced(request_id, traceparent, len(prompt))  # its engine.request span
        with _span("engine.kv_import_prepare", traceparent, self.name) as span:
            ticket = await self._kv_service().prepare_import(
                request_id, prompt, SamplingParams(**params), timeout_s
            )
            span.set_attribute("dynask.remote_prefill", ticket is not None)
        self._opened(request_id, submission.owner)  # aborted if its control plane leaves
        self._publish_routed([submission])  # before any delta: none hopped here yet
        return None if ticket is None else ticket.pack()

    async def prefill_remote(
        self,
        ticket: bytes,
        packed_request: bytes,
        timeout_s: float | None = None,
        routed: dict[str, Any] | None = None,
    ) -> int:
        """Prefill side: computes the prompt's KV and sends the blocks the ticket asks
        for to the decode actor; returns how many blocks were sent. A prefill that takes
        longer than ``timeout_s`` (default ``kv_transfer_service.DEFAULT_PREFILL_TIMEOUT_S``)
        is aborted (the decode actor has stopped waiting). ``routed`` (``{"o": reader id,
        "r": note}``) goes to the other readers (module docstring)."""
        from dynask.actors.runtime.kv_transfer_service import (
            DEFAULT_PREFILL_TIMEOUT_S,
            RemotePrefillTicket,
        )

        timeout_s = DEFAULT_PREFILL_TIMEOUT_S if timeout_s is None else timeout_s
        _, prompt, params, traceparent = read_request(packed_request)
        unpacked = RemotePrefillTicket.unpack(ticket)
        prefill_id = f"{unpacked.transfer_id}/prefill"
        note = routed.get("r") if isinstance(routed, dict) else None
        stream = self._stream if routed is not None and isinstance(note, dict) else None
        if stream is not None and routed is not None:  # as if submitted here under its id
            prefill = SubmittedRequest(prefill_id, prompt, params, traceparent)
            owner = routed.get("o")
            record = routed_record(Submission(prefill, None if owner is None else str(owner), note))
            stream.publish_routed([] if record is None else [record])
        try:
            with _span("engine.remote_prefill", traceparent, self.name) as span:
                blocks = await self._kv_service().prefill_and_send(
                    unpacked, prompt, SamplingParams(**params), timeout_s
                )
                span.set_attribute("dynask.kv_blocks_sent", blocks)
        finally:
            if stream is not None:
                stream.publish(_ended(prefill_id))
        return blocks

    async def cancel_remote_prefill(self, request_id: str) -> None:
        """Decode side: the prefill failed; prefill the request locally now."""
        self._kv_service().cancel_import(request_id)

    async def kv_transfer_stats(self) -> dict[str, int]:
        """Transfers and blocks sent and received, fallbacks by reason, pending imports."""
        return self._kv_service().stats()

    def _abort_remote_prefill(self, request_id: str) -> None:
        """A request waiting for its KV will never be queued: no engine delta ends it, so
        one is published here for the readers that count it (router replicas)."""
        aborted = self._kv_transfer is not None and self._kv_transfer.abort_import(request_id)
        if aborted:
            ended = _ended(request_id)
            self._forget_finished(ended)  # no longer open on this actor
            if self._stream is not None:
                self._stream.publish(ended)

    async def _close_kv_transfer(self) -> None:
        if self._kv_transfer is not None:
            await self._kv_transfer.close()
            self._kv_transfer = None

    def _kv_service(self) -> KVTransferService:
        if self._kv_transfer is None:
            raise RuntimeError(
                f"engine actor {self.name} has no KV transfer listener; call open_kv_transfer"
            )
        return self._kv_transfer


def _span(name: str, traceparent: str | None, actor: str) -> Any:
    """A span of this worker's tracer under ``traceparent`` (a no-op span when either is
    missing: tracing off, or an untraced request)."""
    tracer, parent = worker_tracer(), context_from(traceparent)
    if tracer is None or parent is None:
        return nullcontext(INVALID_SPAN)
    return tracer.start_as_current_span(name, parent, attributes={"dynask.actor": actor})


def _ended(request_id: str) -> list[RequestOutput]:
    """A final delta for a request the engine will not end itself (readers ignore a
    second one)."""
    return [RequestOutput(request_id, "", (), FinishReason.ABORT)]
