"""Moving KV blocks between engine actors: the transport interface and its wire header.

Design decisions:

- A transfer is one tensor (``[layers, 2, blocks, block_size, kv_heads, head_dim]``, as
  an engine exports it) sent to the listener of the actor that will use it, under a
  ``TransferId`` the receiver chose. The receiver registers the id first
  (``expect``) with a tensor it preallocated; the bytes land straight in it. Sending to
  an id nobody expects (any more) is not an error for the sender: the receiver reads the
  bytes into scratch memory and drops them (a decode actor that gave up on a slow
  prefill must not make the late one fail).
- One header per transfer, msgpack: id, dtype, shape. A header whose dtype or shape does
  not match the expectation fails that transfer (``TransferError``) and is discarded.
- A failed transfer (connection cut mid-way, mismatch, closing transport) fails only its
  own future; the receiver keeps listening.
- Transports: ``tcp`` (``kv.transport.tcp``; CUDA tensors are staged through host
  memory) and ``ucxx`` (``kv.transport.ucxx_tensor``; CPU tensors as zero-copy numpy views,
  CUDA tensors as device buffers) move one tensor into a receiver's tensor;
  ``cuda_ipc`` (``kv.transport.cuda_ipc``, a ``BlockTransport``) copies blocks on one host
  device to device, straight into the receiver's reserved paged blocks, and ``ucxx``
  between engines with paged caches (``kv.transport.ucxx_blocks``) receives straight
  into them too, across hosts; both share ``kv.transport.control``'s control protocol.
  ``make_transport`` picks one by name.
- Nothing here knows about Dask or the engine: an actor owns a transport and drives it
  from its event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NewType, Protocol, runtime_checkable

import msgpack

if TYPE_CHECKING:  # imported where tensors are handled: the control plane reads TRANSPORTS
    import torch  # and builds its flags without loading torch

TransferId = NewType("TransferId", str)

TRANSPORTS = ("tcp", "ucxx", "cuda_ipc")
MAX_HEADER_BYTES = 4096


class TransferError(RuntimeError):
    """A KV transfer failed; the message says which one and why."""


@dataclass(frozen=True)
class TransferHeader:
    """What precedes the bytes of one transfer."""

    transfer_id: TransferId
    dtype: str  # a torch dtype name, e.g. "float32"
    shape: tuple[int, ...]

    @classmethod
    def of(cls, transfer_id: TransferId, kv: torch.Tensor) -> TransferHeader:
        return cls(transfer_id, str(kv.dtype).removeprefix("torch."), tuple(kv.shape))

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        import torch

        return count * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise TransferError(f"transfer {self.transfer_id}: unknown dtype {self.dtype!r}")
        return dtype

    def pack(self) -> bytes:
        body: bytes = msgpack.packb([self.transfer_id, self.dtype, list(self.shape)])
        return body

    @classmethod
    def unpack(cls, data: bytes) -> TransferHeader:
        try:
            transfer_id, dtype, shape = msgpack.unpackb(data)
            return cls(TransferId(str(transfer_id)), str(dtype), tuple(int(s) for s in shape))
        except (ValueError, TypeError) as exc:
            raise TransferError(f"malformed KV transfer header: {exc}") from exc


class KVTransport(Protocol):
    """Sends KV tensors to other actors' listeners and receives the ones expected here."""

    name: str

    async def listen(self, host: str) -> str:
        """Starts the listener on an ephemeral port of ``host``; returns its address."""

    def expect(self, transfer_id: TransferId, into: torch.Tensor) -> asyncio.Future[torch.Tensor]:
        """Registers a transfer; its bytes go into ``into`` (contiguous), and the future
        resolves to ``into`` once all arrived, or fails with ``TransferError``."""

    def forget(self, transfer_id: TransferId) -> None:
        """Stops expecting a transfer; its bytes, if they still come, are dropped."""

    async def send(self, address: str, transfer_id: TransferId, kv: torch.Tensor) -> None:
        """Sends ``kv`` to the listener at ``address``; raises ``TransferError``."""

    async def close(self) -> None:
        """Stops listening and closes connections; pending expectations fail."""


@dataclass(frozen=True, eq=False)
class BlockClaim:
    """A receiver's reserved blocks, claimed by one sender for one transfer
    (``BlockTransport.claim``): kept for it until it writes them or gives them back."""

    address: str
    transfer_id: TransferId
    block_ids: list[int]  # the receiver's blocks, in the order the sender's are written
    connection: object = field(repr=False)  # the transport's own handle on the receiver
    extras: tuple[Any, ...] = ()  # what else the receiver answered (a transport's own)


@runtime_checkable
class BlockTransport(Protocol):
    """Writes blocks of a sender's paged cache straight into a receiver's (one host)."""

    name: str
    writes_blocks: bool  # True: the service shares its cache and expects blocks

    async def listen(self, host: str) -> str:
        """Starts the control listener on an ephemeral port of ``host``; its address."""

    def share(self, caches: Sequence[torch.Tensor]) -> None:
        """Offers this engine's paged cache tensors (dim 0: block) to senders."""

    def expect_blocks(self, transfer_id: TransferId, block_ids: list[int]) -> asyncio.Future[None]:
        """Registers a transfer into the reserved ``block_ids``; resolves when written."""

    def forget(self, transfer_id: TransferId) -> None:
        """Stops expecting a transfer; a write in progress finishes first (``writes_done``)."""

    async def writes_done(self, transfer_id: TransferId) -> None:
        """Returns once no sender writes into the transfer's blocks; release them after."""

    async def claim(
        self, address: str, transfer_id: TransferId, num_blocks: int
    ) -> BlockClaim | None:
        """Claims the receiver's blocks for the transfer (early, e.g. while the prefill
        runs); None: it no longer expects them. Raises ``TransferError``."""

    async def write_claimed(
        self, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        """Copies ``block_ids`` of ``caches`` into the claimed blocks. Raises
        ``TransferError``."""

    async def release_claim(self, claim: BlockClaim, reason: str) -> None:
        """Gives claimed blocks back unwritten; the receiver fails the transfer."""

    async def send_blocks(
        self,
        address: str,
        transfer_id: TransferId,
        caches: Sequence[torch.Tensor],
        block_ids: list[int],
    ) -> bool:
        """``claim`` then ``write_claimed``; False: the receiver no longer expects the
        blocks. Raises ``TransferError``."""

    async def close(self) -> None:
        """Stops listening; pending expectations fail."""


class Expectations:
    """The transfers a listener waits for: id → destination tensor and future."""

    def __init__(self) -> None:
        self._pending: dict[TransferId, tuple[torch.Tensor, asyncio.Future[torch.Tensor]]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, transfer_id: TransferId, into: torch.Tensor) -> asyncio.Future[torch.Tensor]:
        if transfer_id in self._pending:
            raise ValueError(f"transfer {transfer_id} is already expected")
        if not into.is_contiguous():
            raise ValueError(f"transfer {transfer_id}: the destination must be contiguous")
        future: asyncio.Future[torch.Tensor] = asyncio.get_running_loop().create_future()
        self._pending[transfer_id] = (into, future)
        return future

    def forget(self, transfer_id: TransferId) -> None:
        entry = self._pending.pop(transfer_id, None)
        if entry is not None and not entry[1].done():
            entry[1].cancel()

    def destination(self, header: TransferHeader) -> torch.Tensor | None:
        """Where the transfer's bytes go; None: nobody expects them (or they do not fit)."""
        entry = self._pending.get(header.transfer_id)
        if entry is None:
            return None
        into, future = entry
        wanted = TransferHeader.of(header.transfer_id, into)
        if wanted != header:
            self._pending.pop(header.transfer_id)
            future.set_exception(
                TransferError(
                    f"transfer {header.transfer_id} sent {header.dtype}{list(header.shape)}; "
                    f"the receiver expected {wanted.dtype}{list(wanted.shape)}"
                )
            )
            return None
        return into

    def complete(self, transfer_id: TransferId) -> None:
        entry = self._pending.pop(transfer_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(entry[0])

    def fail(self, transfer_id: TransferId, reason: str) -> None:
        entry = self._pending.pop(transfer_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(TransferError(f"transfer {transfer_id} failed: {reason}"))

    def fail_all(self, reason: str) -> None:
        for transfer_id in list(self._pending):
            self.fail(transfer_id, reason)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, without a copy."""
    import torch

    view: memoryview = tensor.reshape(-1).view(torch.uint8).numpy().data
    return view.cast("B")


def make_tensor_transport(kind: str) -> KVTransport:
    """A transport that moves one tensor (``tcp`` or ``ucxx``)."""
    transport = make_transport(kind)
    if isinstance(transport, BlockTransport):
        raise ValueError(f"the {kind} KV transport moves blocks between paged caches, not tensors")
    return transport


def make_transport(kind: str, *, paged_cache: bool = False) -> KVTransport | BlockTransport:
    """A transport by name (``tcp``, ``ucxx``, ``cuda_ipc``); ``ValueError`` names the
    choices. With ``paged_cache`` (an engine whose blocks live in paged cache tensors),
    ``ucxx`` receives straight into the reserved blocks (``kv.transport.ucxx_blocks``)."""
    if kind == "tcp":
        from dynask.kv.transport.tcp import TCPTransport

        return TCPTransport()
    if kind == "ucxx" and paged_cache:
        from dynask.kv.transport.ucxx_blocks import UCXXBlockTransport

        return UCXXBlockTransport()
    if kind == "ucxx":
        from dynask.kv.transport.ucxx_tensor import UCXXTransport

        return UCXXTransport()
    if kind == "cuda_ipc":
        from dynask.kv.transport.cuda_ipc import IPCTransport

        return IPCTransport()
    raise ValueError(f"KV transport has value {kind!r}; use one of: {', '.join(TRANSPORTS)}")
