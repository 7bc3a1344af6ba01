"""The control protocol of the block transports: claiming a receiver's reserved blocks,
telling it they are written or given back; each transport moves the bytes its own way.

Design decisions:

- Only control messages cross this socket (a 4-byte length, then msgpack): ``offer``
  (what a sender needs to write into the receiver's cache: CUDA IPC handles, a UCX
  worker address); ``begin`` (the receiver answers with the destination block ids and
  the transport's extras, or ``gone`` when it no longer expects the transfer, so a late
  sender never writes into blocks that were given back); ``done`` after the write, and
  ``abort``: these two, and a transport's own announcements (``NO_ANSWER``), get no
  answer (the connection is ordered, so a transfer costs one round trip).
- That round trip need not wait for the KV: ``claim`` sends ``begin`` (and fetches the
  receiver's offer the first time) while the prefill still runs, ``write_claimed``
  writes and sends ``done`` once it has finished, ``release_claim`` aborts when it
  failed. A claimed transfer is one being written for the receiver: ``forget`` keeps
  its blocks until the sender's ``done`` or ``abort`` (or a broken connection), so the
  receiver must not wait for that before it falls back (it releases the blocks then,
  after ``writes_done``).
- Bytes that may still land (a transport whose receiver posts receives, ``landing``)
  keep the blocks claimed until they have: a transfer is complete when the sender said
  ``done`` *and* its bytes landed, and settled (its blocks free to reuse) only once
  nothing can write into them any more.
- A connection that breaks mid-write fails the transfers it had begun.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from dynask.kv.transfer import BlockClaim, TransferError, TransferId

_LENGTH = struct.Struct(">I")
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
CONNECTION_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError)


@dataclass(eq=False)
class Incoming:
    """A transfer this receiver expects, from ``expect_blocks`` until it is settled."""

    block_ids: list[int]
    future: asyncio.Future[None]
    writing: bool = False  # claimed by a sender (``begin`` answered "ok")
    forgotten: bool = False
    landing: asyncio.Future[None] | None = None  # bytes still on their way (posted receives)
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Peer:
    """A sender's connection to one receiver."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    lock: asyncio.Lock  # one message exchange at a time (answers come in order)
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # prepares its cache once
    offer: list[Any] | None = None  # the receiver's answer to "offer"
    opened: Any = None  # what the transport made of the offer (opened handles, an endpoint)


class ControlledBlockTransport:
    """A ``BlockTransport`` whose control messages go over a socket of its own (module
    docstring); subclasses say what they offer and how they write."""

    name = "blocks"
    writes_blocks = True
    NO_ANSWER: tuple[str, ...] = ("done", "abort")  # verbs the receiver does not answer

    def __init__(self) -> None:
        self._incoming: dict[TransferId, Incoming] = {}
        self._server: asyncio.Server | None = None
        self._peers: dict[str, Peer] = {}

    # ---- what a transport provides ----------------------------------------------------

    def share(self, caches: Sequence[torch.Tensor]) -> None:
        """Offers this engine's paged cache tensors (dim 0: block) to senders."""
        raise NotImplementedError

    def _offer(self) -> list[Any]:
        """The receiver's answer to ``offer``; ``EOFError`` when it shares no cache."""
        raise NotImplementedError

    def _check_offer(self, offer: list[Any]) -> None:
        """Sender side: ``TransferError`` when this sender cannot write into that cache."""

    def _extras(self, transfer_id: TransferId, incoming: Incoming) -> list[Any]:
        """What ``begin``'s "ok" carries after the block ids."""
        return []

    def _announced(self, message: list[Any], incoming: Incoming | None) -> None:
        """A verb of the transport's own (listed in ``NO_ANSWER``)."""
        raise EOFError(f"unknown KV control verb {message[0]!r}")

    async def _write(
        self, peer: Peer, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        """Writes ``block_ids`` of ``caches`` into the claimed blocks; finished (for the
        sender) on return. ``RuntimeError``/``ValueError``: the write failed."""
        raise NotImplementedError

    # ---- the BlockTransport interface -------------------------------------------------

    async def listen(self, host: str) -> str:
        self._server = await asyncio.start_server(self._serve, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"{host}:{port}"

    def expect_blocks(self, transfer_id: TransferId, block_ids: list[int]) -> asyncio.Future[None]:
        if transfer_id in self._incoming:
            raise ValueError(f"transfer {transfer_id} is already expected")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._incoming[transfer_id] = Incoming(list(block_ids), future)
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
        if incoming is not None and (incoming.writing or incoming.landing is not None):
            await incoming.settled.wait()

    async def claim(
        self, address: str, transfer_id: TransferId, num_blocks: int
    ) -> BlockClaim | None:
        """Claims the receiver's blocks reserved for ``transfer_id`` (the ``begin`` round
        trip) and fetches its offer the first time; None when the receiver no longer
        expects the transfer. Until ``write_claimed`` or ``release_claim`` the receiver
        keeps those blocks for this sender, so a claim made while the prefill runs takes
        the round trip off the critical path. Raises ``TransferError``."""
        peer = await self._peer(address)
        try:
            async with peer.lock:
                if peer.offer is None:
                    offer = await _ask(peer, ["offer"])
                    self._check_offer(offer)
                    peer.offer = offer
                reply = await _ask(peer, ["begin", transfer_id, num_blocks])
        except CONNECTION_ERRORS as exc:
            self._drop_peer(address)
            raise TransferError(f"transfer {transfer_id} to {address}: {exc}") from exc
        if reply[0] != "ok":
            return None
        return BlockClaim(address, transfer_id, list(reply[1]), peer, extras=tuple(reply[2:]))

    async def write_claimed(
        self, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        """Writes ``block_ids`` of ``caches`` into the claimed blocks and tells the
        receiver they are written. Raises ``TransferError`` (the receiver has then
        failed the transfer too)."""
        peer, transfer_id = self._peers.get(claim.address), claim.transfer_id
        if peer is None or peer is not claim.connection:
            raise TransferError(f"transfer {transfer_id}: the connection broke after the claim")
        try:
            if len(block_ids) != len(claim.block_ids):
                reason = f"{len(block_ids)} blocks to send; {len(claim.block_ids)} claimed"
                await tell(peer, ["abort", transfer_id, reason])
                raise TransferError(f"transfer {transfer_id}: {reason}")
            try:
                await self._write(peer, claim, caches, block_ids)
            except (RuntimeError, ValueError) as exc:
                log.warning("transfer %s: the write failed", transfer_id, exc_info=True)
                await tell(peer, ["abort", transfer_id, str(exc)])
                raise TransferError(f"transfer {transfer_id}: the write failed: {exc}") from exc
            await tell(peer, ["done", transfer_id])
        except CONNECTION_ERRORS as exc:
            self._drop_peer(claim.address)
            raise TransferError(f"transfer {transfer_id} to {claim.address}: {exc}") from exc

    async def release_claim(self, claim: BlockClaim, reason: str) -> None:
        """Gives the claimed blocks back unwritten (the prefill failed); the receiver
        fails the transfer with ``reason``. A broken connection has done so already."""
        peer = self._peers.get(claim.address)
        if peer is None or peer is not claim.connection:
            return
        try:
            await tell(peer, ["abort", claim.transfer_id, reason])
        except CONNECTION_ERRORS as exc:
            log.info("transfer %s: the abort was not delivered: %s", claim.transfer_id, exc)
            self._drop_peer(claim.address)

    async def send_blocks(
        self,
        address: str,
        transfer_id: TransferId,
        caches: Sequence[torch.Tensor],
        block_ids: list[int],
    ) -> bool:
        """Writes ``block_ids`` of ``caches`` into the receiver's reserved blocks; False
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
        begun: set[TransferId] = set()  # not yet done or aborted
        announced: set[TransferId] = set()  # every transfer begun on this connection
        try:
            while True:
                message = await _read(reader)
                reply = self._answer(message, begun)
                announced |= begun
                if message[0] not in self.NO_ANSWER:
                    await _write(writer, reply)
        except CONNECTION_ERRORS:
            pass
        finally:
            for transfer_id in begun:
                self._fail(transfer_id, "the sender's connection broke mid-write")
            self._sender_gone([t for t in announced if t in self._incoming])
            writer.close()

    def _sender_gone(self, transfer_ids: list[TransferId]) -> None:
        """The connection of the sender of ``transfer_ids`` (still unsettled) broke."""

    def _answer(self, message: list[Any], begun: set[TransferId]) -> list[Any]:
        verb = message[0]
        if verb == "offer":
            return self._offer()
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
            return ["ok", incoming.block_ids, *self._extras(transfer_id, incoming)]
        if verb == "done":
            begun.discard(transfer_id)
            if incoming is not None:
                self._written(transfer_id, incoming)
        elif verb == "abort":
            begun.discard(transfer_id)
            self._fail(transfer_id, f"the sender aborted: {message[2]}")
        else:
            self._announced(message, incoming)
        return ["ok"]

    def _written(self, transfer_id: TransferId, incoming: Incoming) -> None:
        """``done``: complete once the bytes have landed too."""
        landing = incoming.landing
        if landing is not None and not landing.done():
            landing.add_done_callback(lambda _: self._written(transfer_id, incoming))
            return
        if landing is not None and (landing.cancelled() or landing.exception() is not None):
            error = "cancelled" if landing.cancelled() else landing.exception()
            self._fail(transfer_id, f"receiving the blocks failed: {error}")
            return
        if not incoming.future.done():
            incoming.future.set_result(None)
        self._settle(transfer_id)

    def _fail(self, transfer_id: TransferId, reason: str) -> None:
        incoming = self._incoming.get(transfer_id)
        if incoming is not None and not incoming.future.done():
            incoming.future.set_exception(TransferError(f"transfer {transfer_id} failed: {reason}"))
        self._settle(transfer_id)

    def _settle(self, transfer_id: TransferId) -> None:
        incoming = self._incoming.get(transfer_id)
        if incoming is None:
            return
        incoming.writing = False
        landing = incoming.landing
        if landing is not None and not landing.done():  # bytes may still land: wait for them
            landing.add_done_callback(lambda _: self._settle(transfer_id))
            return
        self._incoming.pop(transfer_id, None)
        incoming.settled.set()

    # ---- sending side -----------------------------------------------------------------

    async def _peer(self, address: str) -> Peer:
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
        return self._peers.setdefault(address, Peer(reader, writer, asyncio.Lock()))

    def _drop_peer(self, address: str) -> None:
        peer = self._peers.pop(address, None)
        if peer is not None:
            peer.writer.close()


async def _ask(peer: Peer, message: list[Any]) -> list[Any]:
    await _write(peer.writer, message)
    return await _read(peer.reader)


async def tell(peer: Peer, message: list[Any]) -> None:
    """A message the receiver does not answer (``done``, ``abort``, announcements)."""
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
