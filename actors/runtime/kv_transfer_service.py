"""An engine actor's side of disaggregated prefill: reserving, receiving, exporting KV.

Design decisions:

- The decode actor owns the request from the moment it accepts a ticket. It reserves
  blocks (``kv_cache.handoff.reserve_import``), registers the transfer with its transport, and
  a task waits for the KV. Whatever happens next — the KV arrives, the transfer breaks,
  the timeout passes, the control plane cancels it because the prefill failed — that
  task ends by queueing the request on the engine (as a prefix hit on the moved blocks,
  or as a plain local prefill) and releasing the reservation. A request is never lost
  and no block stays referenced.
- A client that disconnects while the KV is on its way: the reservation is released at
  once and the request is never queued; the prefill is not interrupted (its blocks are
  freed after it sent, and the receiver drops the late bytes).
- The prefill actor runs the prompt's movable blocks as an ordinary one-token request
  (so it batches with everything else and fills its own prefix cache), then pins those
  blocks, exports only the ones the decode actor lacks, unpins them and sends.
- Calls that take the engine's step lock run in a thread: an engine step can hold it
  for a whole forward pass, and the worker's event loop must not wait for that.
- A block transport (``cuda_ipc``: GPU engines of one host; ``ucxx`` between engines
  with paged caches) writes the prefill engine's blocks straight into the decode
  engine's reserved ones (device to device on GPUs): the decode
  actor shares its paged cache once and expects block ids instead of a staging tensor;
  the prefill actor copies while its blocks are pinned. It claims the destination
  blocks while its prefill runs (the transport's ``begin`` round trip, off the request's
  path) and gives them back if the prefill fails; a claim answered "gone" (the decode
  actor gave up) aborts the prefill. A failed or abandoned import queues its
  request for a local prefill at once, but releases its blocks only once no sender writes
  into them any more (a claimed transfer's sender may still be prefilling).
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from dynask.actors.api.engine_inputs import check_prompt
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.kv_cache.handoff import (
    ImportReservation,
    commit_import,
    pin_prefix,
    release,
    reserve_import,
)
from dynask.kv.hashing import hash_seed
from dynask.kv.transfer import (
    BlockClaim,
    BlockTransport,
    KVTransport,
    TransferError,
    TransferId,
)

log = logging.getLogger(__name__)

DEFAULT_PREFILL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RemotePrefillTicket:
    """What a prefill actor needs to fill a decode actor's reserved blocks."""

    transfer_id: TransferId
    address: str  # the decode actor's KV listener
    first_block: int  # the first prompt block the decode actor lacks
    num_blocks: int  # prompt blocks covered (the ones before first_block are not sent)

    @property
    def blocks_to_send(self) -> int:
        return self.num_blocks - self.first_block

    def pack(self) -> bytes:
        body: bytes = msgpack.packb(
            [self.transfer_id, self.address, self.first_block, self.num_blocks]
        )
        return body

    @classmethod
    def unpack(cls, data: bytes) -> RemotePrefillTicket:
        transfer_id, address, first_block, num_blocks = msgpack.unpackb(data)
        return cls(TransferId(str(transfer_id)), str(address), int(first_block), int(num_blocks))


@dataclass(eq=False)
class PendingImport:
    """A request whose prompt KV is on its way to this (decode) actor."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    reservation: ImportReservation
    staging: torch.Tensor | None  # None: a block transport writes into the reserved blocks
    arrived: asyncio.Future[Any]
    aborted: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class KVTransferService:
    """Moves prompt KV between this actor's engine and other actors' (module docstring)."""

    def __init__(self, engine: LLMEngine, transport: KVTransport | BlockTransport) -> None:
        self.engine = engine
        self.transport = transport
        self.address: str | None = None
        self.counters: Counter[str] = Counter()
        self._pending: dict[str, PendingImport] = {}
        self._kv_template: torch.Tensor | None = None

    async def start(self, host: str) -> str:
        if isinstance(self.transport, BlockTransport):
            self.transport.share(paged_caches(self.engine, self.transport.name))
        self.address = await self.transport.listen(host)
        return self.address

    def stats(self) -> dict[str, int]:
        return {**self.counters, "pending_imports": len(self._pending)}

    # ---- decode side ------------------------------------------------------------------

    async def prepare_import(
        self, request_id: str, prompt: list[int], params: SamplingParams, timeout_s: float
    ) -> RemotePrefillTicket | None:
        """Reserves blocks and waits (in a task) for the KV; None: nothing to move or no
        room, and the request was queued for a local prefill already."""
        engine = self.engine
        check_prompt(prompt, engine.max_model_len, engine.parts.model_config.vocab_size)
        if self.address is None:
            raise RuntimeError("the KV transfer listener has not started")
        seed = hash_seed(params.extra_keys)
        reservation = await asyncio.to_thread(
            engine.with_kv_blocks, lambda kv: reserve_import(kv, prompt, seed)
        )
        if reservation is None:
            self.counters["local_prefills"] += 1
            engine.add_request(prompt, params, request_id)
            return None
        transfer_id = TransferId(request_id)
        staging: torch.Tensor | None = None
        arrived: asyncio.Future[Any]
        if isinstance(self.transport, BlockTransport):
            arrived = self.transport.expect_blocks(transfer_id, reservation.incoming_ids)
        else:
            staging = self._staging(len(reservation.incoming))
            arrived = self.transport.expect(transfer_id, staging)
        pending = PendingImport(request_id, prompt, params, reservation, staging, arrived)
        self._pending[request_id] = pending
        pending.task = asyncio.create_task(self._finish_import(pending, timeout_s))
        return RemotePrefillTicket(
            transfer_id, self.address, reservation.first_incoming, len(reservation.blocks)
        )

    def cancel_import(self, request_id: str) -> None:
        """The prefill failed: stop waiting and prefill locally now."""
        if request_id in self._pending:
            self.transport.forget(TransferId(request_id))

    def abort_import(self, request_id: str) -> bool:
        """The client went away: release the reservation and never queue the request.
        False when no import of it was pending (it is queued, or unknown)."""
        pending = self._pending.get(request_id)
        if pending is None or pending.aborted:
            return False
        pending.aborted = True
        self.transport.forget(TransferId(request_id))
        return True

    async def _finish_import(self, pending: PendingImport, timeout_s: float) -> None:
        engine = self.engine
        reservation = pending.reservation
        try:
            reason = await self._wait_for_kv(pending, timeout_s)
            if reason is None:
                reason = await self._import(pending)
            if reason is not None:
                self.counters[f"fallback_{reason}"] += 1
                if not pending.aborted:  # prefilled here at once, into blocks of its own
                    log.info("request %s: remote prefill failed (%s)", pending.request_id, reason)
                    engine.add_request(pending.prompt, pending.params, pending.request_id)
                if isinstance(self.transport, BlockTransport):  # no late write may land
                    await self.transport.writes_done(TransferId(pending.request_id))
                await self._release(reservation)
                return
            if not pending.aborted:
                engine.add_request(pending.prompt, pending.params, pending.request_id)
            await self._release(reservation)
        finally:
            self._pending.pop(pending.request_id, None)

    async def _wait_for_kv(self, pending: PendingImport, timeout_s: float) -> str | None:
        """None when the KV arrived; else why not."""
        arrived = pending.arrived
        await asyncio.wait({arrived}, timeout=timeout_s)
        if not arrived.done():
            self.transport.forget(TransferId(pending.request_id))
            return "timeout"
        if pending.aborted:
            return "aborted"
        if arrived.cancelled():
            return "cancelled"
        if arrived.exception() is not None:
            return "transfer_error"
        return None

    async def _import(self, pending: PendingImport) -> str | None:
        reservation, engine, staging = pending.reservation, self.engine, pending.staging
        try:
            if staging is not None:  # else the blocks were written in place
                await asyncio.to_thread(engine.import_kv, reservation.incoming_ids, staging)
        except ValueError as exc:
            log.warning("request %s: received KV does not fit: %s", pending.request_id, exc)
            return "import_error"
        await asyncio.to_thread(engine.with_kv_blocks, lambda kv: commit_import(kv, reservation))
        self.counters["transfers_received"] += 1
        self.counters["blocks_received"] += len(reservation.incoming)
        return "aborted" if pending.aborted else None

    async def _release(self, reservation: ImportReservation) -> None:
        await asyncio.to_thread(
            self.engine.with_kv_blocks, lambda kv: release(kv, reservation.blocks)
        )

    def _staging(self, num_blocks: int) -> torch.Tensor:
        if self._kv_template is None:
            self._kv_template = self.engine.export_kv([])
        template = self._kv_template
        shape = (*template.shape[:2], num_blocks, *template.shape[3:])
        return torch.empty(shape, dtype=template.dtype, device=template.device)

    # ---- prefill side -----------------------------------------------------------------

    async def prefill_and_send(
        self,
        ticket: RemotePrefillTicket,
        prompt: list[int],
        params: SamplingParams,
        timeout_s: float = DEFAULT_PREFILL_TIMEOUT_S,
    ) -> int:
        """Computes the prompt's first ``ticket.num_blocks`` blocks, sends the ones the
        decode actor lacks; returns how many were sent. Raises ``TransferError``, also
        when the prefill takes longer than ``timeout_s`` (the decode actor has stopped
        waiting by then; the prefill is aborted and its blocks freed)."""
        engine = self.engine
        tokens = prompt[: ticket.num_blocks * engine.kv_block_size]
        seed = hash_seed(params.extra_keys)
        prefill = SamplingParams(max_tokens=1, ignore_eos=True, extra_keys=params.extra_keys)
        request_id = f"{ticket.transfer_id}/prefill"
        claiming = self._claim_early(ticket)
        stream = engine.add_request(tokens, prefill, request_id)
        if claiming is not None:  # the decode actor gave up already: stop prefilling
            claiming.add_done_callback(
                lambda task: engine.abort(request_id) if _unwanted(task) else None
            )
        try:
            await self._prefilled(stream, request_id, ticket, timeout_s)
            claim = None if claiming is None else await claiming
        except BaseException as exc:
            if claiming is not None and _unwanted(claiming):
                self.counters["transfers_unwanted"] += 1
                return 0
            if claiming is not None:
                await self._give_back(claiming, f"the prefill failed: {exc}")
            raise
        if claiming is not None and claim is None:
            self.counters["transfers_unwanted"] += 1  # the decode actor gave up
            return 0
        blocks = await asyncio.to_thread(
            engine.with_kv_blocks, lambda kv: pin_prefix(kv, tokens, seed)
        )
        try:
            if len(blocks) < ticket.num_blocks:
                raise TransferError(
                    f"transfer {ticket.transfer_id}: {ticket.num_blocks - len(blocks)} prompt "
                    "blocks left the prefill actor's cache before export"
                )
            ids = [int(b.block_id) for b in blocks[ticket.first_block : ticket.num_blocks]]
            if claim is not None:  # copied while pinned
                assert isinstance(self.transport, BlockTransport)
                caches = paged_caches(engine, self.transport.name)
                await self.transport.write_claimed(claim, caches, ids)
            else:
                kv = await asyncio.to_thread(engine.export_kv, ids)
        except BaseException as exc:
            if claim is not None:  # an abort after a failed write is answered by nothing
                await self._give_back_claim(claim, str(exc))
            raise
        finally:
            await asyncio.to_thread(engine.with_kv_blocks, lambda kv: release(kv, blocks))
        if claim is None:
            assert not isinstance(self.transport, BlockTransport)
            await self.transport.send(ticket.address, ticket.transfer_id, kv)
        self.counters["transfers_sent"] += 1
        self.counters["blocks_sent"] += len(ids)
        return len(ids)

    def _claim_early(self, ticket: RemotePrefillTicket) -> asyncio.Task[BlockClaim | None] | None:
        """A block transport claims the decode actor's blocks while the prefill runs, so
        the round trip is not on the request's path (``kv.transport.cuda_ipc``)."""
        if not isinstance(self.transport, BlockTransport):
            return None
        return asyncio.create_task(
            self.transport.claim(ticket.address, ticket.transfer_id, ticket.blocks_to_send)
        )

    async def _prefilled(
        self, stream: Any, request_id: str, ticket: RemotePrefillTicket, timeout_s: float
    ) -> None:
        """Waits for the prefill request; ``TransferError`` when it timed out (aborted
        then) or was aborted."""
        try:
            await asyncio.to_thread(stream.wait, timeout_s)
        except queue.Empty:
            self.engine.abort(request_id)
            self.counters["prefill_timeouts"] += 1
            raise TransferError(
                f"transfer {ticket.transfer_id}: the prefill took longer than {timeout_s:g} s"
            ) from None
        if stream.finish_reason == "abort":
            raise TransferError(f"transfer {ticket.transfer_id}: the prefill was aborted")

    async def _give_back(self, claiming: asyncio.Task[BlockClaim | None], reason: str) -> None:
        """Releases an early claim, whether or not it has been answered yet."""
        try:
            claim = await claiming
        except (TransferError, asyncio.CancelledError):
            return  # no claim was made (the receiver fails the transfer by itself)
        if claim is not None:
            await self._give_back_claim(claim, reason)

    async def _give_back_claim(self, claim: BlockClaim, reason: str) -> None:
        assert isinstance(self.transport, BlockTransport)
        await self.transport.release_claim(claim, reason)

    async def close(self) -> None:
        for pending in list(self._pending.values()):
            pending.aborted = True
        await self.transport.close()
        tasks = [p.task for p in self._pending.values() if p.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)


def _unwanted(claiming: asyncio.Task[BlockClaim | None]) -> bool:
    """The claim was answered "gone": the decode actor no longer expects the blocks."""
    return (
        claiming.done()
        and not claiming.cancelled()
        and claiming.exception() is None
        and (claiming.result() is None)
    )


def has_paged_cache(engine: LLMEngine) -> bool:
    """The engine keeps its KV in paged cache tensors (the built-in torch engine)."""
    return getattr(engine.parts.runner, "kv_caches", None) is not None


def paged_caches(engine: LLMEngine, transport: str) -> list[torch.Tensor]:
    """The engine's paged K and V tensors, layer by layer (what a block transport moves)."""
    caches = getattr(engine.parts.runner, "kv_caches", None)
    if caches is None:
        raise ValueError(
            f"the {transport} KV transport needs the built-in torch engine's paged cache; "
            "use --kv-transport tcp for this engine"
        )
    return [tensor for pair in caches for tensor in pair]


def as_llm_engine(engine: Any, actor: str, kind: str) -> LLMEngine:
    """The engine, if it can move KV (the built-in engine and the mocker can)."""
    if not isinstance(engine, LLMEngine):
        raise TypeError(
            f"engine actor {actor} runs out={kind}, which has no KV blocks to move; a "
            "prefill or decode role needs out=torch or out=mocker"
        )
    return engine
