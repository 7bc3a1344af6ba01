"""KV transfer on one host, written straight into the receiver's paged cache (CUDA IPC).

Design decisions:

- The receiving engine shares its paged cache tensors once (``share``): on a GPU as
  CUDA IPC memory handles (``torch.multiprocessing.reductions.reduce_tensor``), on a
  CPU (tests) as POSIX shared memory. A sender opens them once per receiver and copies
  its blocks device to device into the receiver's *reserved* blocks: no staging tensor
  on either side, no host memory, no PCIe crossing on one GPU.
- The copy is one fused launch over every layer's blocks (``block_copy``), on a stream
  of its own, so it waits neither for the sender's engine nor on 64 copies. The first
  copy to a receiver runs in a thread (it opens the handles, finds the ``BlockLayout``
  and may compile the kernel); later ones are launched on the event loop (microseconds:
  the layout is reused, the rows are built on the device) and only the wait for the
  copy's event goes to a thread, overlapping the copy. Measured on a CPU (shared memory,
  ``bench.disaggregation.ipc_control``), what is left per transfer is the ``begin`` round
  trip and that wait's wake-up.
- Only control messages cross a socket (a 4-byte length, then msgpack): ``handles``;
  ``begin`` (the receiver answers with the destination block ids, or ``gone`` when it
  no longer expects the transfer, so a late sender never writes into blocks that were
  given back); ``done`` after the copy finished, and ``abort``: these two get no answer
  (the connection is ordered, so a transfer costs one round trip).
- That round trip need not wait for the KV: ``claim`` sends ``begin`` (and opens the
  receiver's cache the first time) while the prefill still runs, ``write_claimed``
  copies and sends ``done`` once it has finished, ``release_claim`` aborts when it
  failed. A claimed transfer is one being written for the receiver: ``forget`` keeps
  its blocks until the sender's ``done`` or ``abort`` (or a broken connection), so the
  receiver must not wait for that before it falls back (it releases the blocks then).
- A process cannot open its own CUDA IPC handles (CUDA answers "invalid device
  context"), so the handles name the process that shared them and a sender refuses its
  own with a ``TransferError`` that says so. (A prefill actor that served a request by
  itself and sent its KV to itself failed exactly so on the H200; the orchestrator no
  longer plans that.)
- A transfer being written (claimed) cannot be forgotten at once: ``forget`` then
  cancels the future but keeps the blocks' claim until ``done``, ``abort`` or the
  connection breaks; ``writes_done`` waits for that, and the caller releases the
  blocks only then. A connection that breaks mid-write fails the transfer.
- Several GPUs of one host: CUDA numbers devices per process (``CUDA_VISIBLE_DEVICES``),
  so the handles carry the GPU's UUID and the sender maps it to its own index. The
  GPU must be visible to the sender (``gpu_placement`` rotates the visible list).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any
from uuid import uuid4

import msgpack
import torch
import torch.multiprocessing
from torch.multiprocessing.reductions import reduce_tensor

from dynask.kv.gpu.block_copy import BlockCopy, BlockLayout, copy_blocks, launch_blocks
from dynask.kv.transfer import BlockClaim, TransferError, TransferId

_LENGTH = struct.Struct(">I")
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
_NO_ANSWER = ("done", "abort")  # verbs the receiver does not answer


@dataclass(eq=False)
class _Incoming:
    block_ids: list[int]
    future: asyncio.Future[None]
    writing: bool = False
    forgotten: bool = False
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Peer:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    lock: asyncio.Lock  # one message exchange at a time (answers come in order)
    copying: asyncio.Lock = field(default_factory=asyncio.Lock)  # opens its cache once
    handles: list[Any] | None = None  # the receiver's answer to "handles"
    caches: list[torch.Tensor] | None = None  # its tensors, opened in the copying thread
    layout: BlockLayout | None = None  # where our caches and its lie, found at the first copy


class IPCTransport:
    """Block transport over CUDA IPC / shared memory (see the module docstring)."""

    name = "cuda_ipc"
    writes_blocks = True

    def __init__(self) -> None:
        self._handles: bytes | None = None
        self._incoming: dict[TransferId, _Incoming] = {}
        self._server: asyncio.Server | None = None
        self._peers: dict[str, _Peer] = {}

    async def listen(self, host: str) -> str:
        self._server = await asyncio.start_server(self._serve, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"{host}:{port}"

    def share(self, caches: Sequence[torch.Tensor]) -> None:
        """Offers this engine's paged cache tensors (dim 0: block) to senders."""
        if caches:
            bind_device(caches[0].device)
        self._handles = pickle.dumps((process_id(), [_handle(tensor) for tensor in caches]))

    def expect_blocks(self, transfer_id: TransferId, block_ids: list[int]) -> asyncio.Future[None]:
        if transfer_id in self._incoming:
            raise ValueError(f"transfer {transfer_id} is already expected")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._incoming[transfer_id] = _Incoming(list(block_ids), future)
        return future

    def forget(self, transfer_id: TransferId) -> None:
        incoming = self._incoming.get(transfer_id)
        if incoming is None:
            return
        incoming.forgotten = True
        if not incoming.future.done():
            incoming.future.cancel()
        if not incoming.writing:
            self._settle(transfer_id)

    async def writes_done(self, transfer_id: TransferId) -> None:
        """Returns once no sender writes into the transfer's blocks any more."""
        incoming = self._incoming.get(transfer_id)
        if incoming is not None and incoming.writing:
            await incoming.settled.wait()

    async def claim(
        self, address: str, transfer_id: TransferId, num_blocks: int
    ) -> BlockClaim | None:
        """Claims the receiver's blocks reserved for ``transfer_id`` (the ``begin`` round
        trip) and opens its cache the first time; None when the receiver no longer
        expects the transfer. Until ``write_claimed`` or ``release_claim`` the receiver
        keeps those blocks for this sender, so a claim made while the prefill runs takes
        the round trip off the critical path. Raises ``TransferError``."""
        peer = await self._peer(address)
        try:
            async with peer.lock:
                if peer.handles is None:
                    handles = await _ask(peer, ["handles"])
                    check_openable(handles)
                    peer.handles = handles
                reply = await _ask(peer, ["begin", transfer_id, num_blocks])
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            self._drop_peer(address)
            raise TransferError(f"transfer {transfer_id} to {address}: {exc}") from exc
        if reply[0] != "ok":
            return None
        return BlockClaim(address, transfer_id, list(reply[1]), connection=peer)

    async def write_claimed(
        self, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        """Copies ``block_ids`` of ``caches`` into the claimed blocks and tells the
        receiver they are written. Raises ``TransferError`` (the receiver has then
        failed the transfer too)."""
        peer, transfer_id = self._peers.get(claim.address), claim.transfer_id
        if peer is None or peer is not claim.connection:
            raise TransferError(f"transfer {transfer_id}: the connection broke after the claim")
        try:
            if len(block_ids) != len(claim.block_ids):
                reason = f"{len(block_ids)} blocks to send; {len(claim.block_ids)} claimed"
                await _tell(peer, ["abort", transfer_id, reason])
                raise TransferError(f"transfer {transfer_id}: {reason}")
            try:
                async with peer.copying:
                    await _copy(peer, caches, block_ids, claim.block_ids)
            except (RuntimeError, ValueError) as exc:
                log.warning("transfer %s: the copy failed", transfer_id, exc_info=True)
                await _tell(peer, ["abort", transfer_id, str(exc)])
                raise TransferError(f"transfer {transfer_id}: the copy failed: {exc}") from exc
            await _tell(peer, ["done", transfer_id])
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            self._drop_peer(claim.address)
            raise TransferError(f"transfer {transfer_id} to {claim.address}: {exc}") from exc

    async def release_claim(self, claim: BlockClaim, reason: str) -> None:
        """Gives the claimed blocks back unwritten (the prefill failed); the receiver
        fails the transfer with ``reason``. A broken connection has done so already."""
        peer = self._peers.get(claim.address)
        if peer is None or peer is not claim.connection:
            return
        try:
            await _tell(peer, ["abort", claim.transfer_id, reason])
        except (OSError, EOFError) as exc:
            log.info("transfer %s: the abort was not delivered: %s", claim.transfer_id, exc)
            self._drop_peer(claim.address)

    async def send_blocks(
        self,
        address: str,
        transfer_id: TransferId,
        caches: Sequence[torch.Tensor],
        block_ids: list[int],
    ) -> bool:
        """Copies ``block_ids`` of ``caches`` into the receiver's reserved blocks; False
        when the receiver no longer expects the transfer. Raises ``TransferError``."""
        claim = await self.claim(address, transfer_id, len(block_ids))
        if claim is None:
            return False
        await self.write_claimed(claim, caches, block_ids)
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for address in list(self._peers):
            self._drop_peer(address)
        for transfer_id in list(self._incoming):
            self._fail(transfer_id, "the transport closed")

    # ---- receiving side ---------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        begun: set[TransferId] = set()
        try:
            while True:
                message = await _read(reader)
                reply = self._answer(message, begun)
                if message[0] not in _NO_ANSWER:
                    await _write(writer, reply)
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass
        finally:
            for transfer_id in begun:
                self._fail(transfer_id, "the sender's connection broke mid-write")
            writer.close()

    def _answer(self, message: list[Any], begun: set[TransferId]) -> list[Any]:
        verb = message[0]
        if verb == "handles":
            if self._handles is None:
                raise EOFError("this receiver shares no cache")
            return [self._handles]
        transfer_id = TransferId(str(message[1]))
        incoming = self._incoming.get(transfer_id)
        if verb == "begin":
            if incoming is None or incoming.forgotten:
                return ["gone"]
            if int(message[2]) != len(incoming.block_ids):
                self._fail(
                    transfer_id,
                    f"the sender has {message[2]} blocks; {len(incoming.block_ids)} are reserved",
                )
                return ["gone"]
            incoming.writing = True
            begun.add(transfer_id)
            return ["ok", incoming.block_ids]
        begun.discard(transfer_id)
        if verb == "done" and incoming is not None:
            if not incoming.future.done():
                incoming.future.set_result(None)
            self._settle(transfer_id)
        elif verb == "abort":
            self._fail(transfer_id, f"the sender aborted: {message[2]}")
        return ["ok"]

    def _fail(self, transfer_id: TransferId, reason: str) -> None:
        incoming = self._incoming.get(transfer_id)
        if incoming is not None and not incoming.future.done():
            incoming.future.set_exception(TransferError(f"transfer {transfer_id} failed: {reason}"))
        self._settle(transfer_id)

    def _settle(self, transfer_id: TransferId) -> None:
        incoming = self._incoming.pop(transfer_id, None)
        if incoming is not None:
            incoming.writing = False
            incoming.settled.set()

    # ---- sending side -----------------------------------------------------------------

    async def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is not None:
            return peer
        host, port = address.rsplit(":", 1)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise TransferError(f"cannot reach the KV listener at {address}: {exc}") from exc
        return self._peers.setdefault(address, _Peer(reader, writer, asyncio.Lock()))

    def _drop_peer(self, address: str) -> None:
        peer = self._peers.pop(address, None)
        if peer is not None:
            peer.writer.close()


def bind_device(device: torch.device) -> None:
    """Makes ``device`` current in this thread (a Dask worker's pool thread starts on
    device 0), so the handles open and the copy runs on the cache's own GPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


async def _copy(
    peer: _Peer, caches: Sequence[torch.Tensor], src_ids: list[int], dst_ids: list[int]
) -> None:
    """The copy into the peer's blocks, finished on return (module docstring)."""
    layout = peer.layout
    if layout is None or peer.caches is None or not layout.fits(caches, peer.caches):
        await asyncio.to_thread(_open_and_copy, peer, caches, src_ids, dst_ids)
        return
    started = launch_blocks(caches, src_ids, peer.caches, dst_ids, layout)
    await wait_for_copy(started)


async def wait_for_copy(started: BlockCopy) -> None:
    """Returns once ``started`` is done, without blocking the event loop: the wait for
    its event runs in a thread while the GPU copies."""
    await asyncio.to_thread(started.wait)


def _open_and_copy(
    peer: _Peer, caches: Sequence[torch.Tensor], src_ids: list[int], dst_ids: list[int]
) -> None:
    bind_device(caches[0].device)
    if peer.caches is None:
        assert peer.handles is not None
        peer.caches = _open(peer.handles)
    peer.layout = copy_blocks(caches, src_ids, peer.caches, dst_ids, peer.layout)


# ---- handles ----------------------------------------------------------------------------

_DEVICE_ARG = 6  # storage_device in rebuild_cuda_tensor's arguments


def _handle(tensor: torch.Tensor) -> tuple[str, Any]:
    if tensor.device.type == "cuda":
        rebuild, args = reduce_tensor(tensor)  # type: ignore[no-untyped-call]
        gpu = str(torch.cuda.get_device_properties(tensor.device).uuid)
        return "cuda", (gpu, pickle.dumps((rebuild, args)))
    # CPU caches (tests, CPU engines on one host): POSIX shared memory by file name.
    torch.multiprocessing.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    return "cpu", bytes(ForkingPickler.dumps(tensor))


_PROCESS_TOKEN = uuid4().hex  # with the PID: a forked child keeps the token


def process_id() -> str:
    """This process, unlike any other on the host (a PID alone can repeat across PID
    namespaces)."""
    return f"{os.getpid()}-{_PROCESS_TOKEN}"


def check_openable(reply: list[Any]) -> None:
    """``TransferError`` when the handles are CUDA memory this very process shared."""
    owner, handles = pickle.loads(reply[0])
    if owner == process_id() and any(kind == "cuda" for kind, _ in handles):
        raise TransferError(
            "the receiver's paged cache was shared by this very process; CUDA IPC cannot "
            "open a process's own memory (CUDA answers 'invalid device context'): send "
            "to another engine's process"
        )


def _open(reply: list[Any]) -> list[torch.Tensor]:
    _, handles = pickle.loads(reply[0])
    tensors = []
    for kind, payload in handles:
        if kind == "cpu":
            tensors.append(pickle.loads(payload))
            continue
        gpu, packed = payload
        rebuild, args = pickle.loads(packed)
        args = (*args[:_DEVICE_ARG], _local_index(gpu), *args[_DEVICE_ARG + 1 :])
        tensors.append(rebuild(*args))
    return tensors


def _local_index(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise TransferError(
        f"the receiver's GPU {uuid} is not visible here; CUDA IPC needs both engines' GPUs "
        "in CUDA_VISIBLE_DEVICES (or use --kv-transport ucxx)"
    )


async def _ask(peer: _Peer, message: list[Any]) -> list[Any]:
    await _write(peer.writer, message)
    return await _read(peer.reader)


async def _tell(peer: _Peer, message: list[Any]) -> None:
    """A message the receiver does not answer (``done``, ``abort``)."""
    async with peer.lock:
        await _write(peer.writer, message)


async def _write(writer: asyncio.StreamWriter, message: list[Any]) -> None:
    body: bytes = msgpack.packb(message)
    writer.write(_LENGTH.pack(len(body)) + body)
    await writer.drain()


async def _read(reader: asyncio.StreamReader) -> list[Any]:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    message: list[Any] = msgpack.unpackb(await reader.readexactly(size))
    return message
