"""KV transfer between hosts over UCXX, received straight into the receiver's paged blocks.

Design decisions:

- The control protocol (claim while the prefill runs, ``done``, ``abort``, a broken
  connection, a forgotten transfer) is ``kv.transport.control``'s. The receiver offers
  its UCX worker address (a sender connects to the worker itself: no UCX listener) and
  the bytes of one block of each cache tensor; each begun transfer gets a tag base of
  its own (random, above 20 bits of message index), so no other transfer's bytes can
  match its receives.
- A write is a list of segments: runs of blocks that lie contiguous in the receiver's
  cache. The sender announces them (``write``, before any byte), then sends one tagged
  message per cache tensor and segment. The receiver, on ``write``, posts one receive
  per message on its UCX worker, into that slice of its own cache tensor: the bytes land
  in the reserved blocks with no staging on the receiving side (UCX's rendezvous pulls
  into the posted buffer; CUDA memory moves over NVLink, cuda_ipc or RDMA where UCX
  finds them, and over TCP on a machine without them).
- The sender sends straight from its cache when its blocks are contiguous wherever the
  receiver's are; otherwise it first gathers them into one buffer on its own device
  (one fused copy), so a transfer is tensors x the receiver's runs messages.
- Each message costs UCX and Python from tens of microseconds to a millisecond (on the
  H200: 1 GiB in 64 messages 3.8 ms, 14% of a device copy; 64 one-block messages
  50–140 ms; 512 scattered runs, 32k messages, 1.9 s). A *staged* write (a sender whose
  ``direct_max_runs`` is below the receiver's runs) sends one message into a buffer of
  the receiver's, which then copies it into the reserved blocks (one fused copy): 512
  scattered blocks in 6.4 ms. It is off by default (every write is direct): on the
  H200 the receiving process crashed (SIGSEGV) on staged writes in the CUDA test, with
  or without torch's allocator cache, and the cause is not found.
- UCXX cannot cancel one posted receive, so posted receives keep their blocks: a
  transfer is settled (its blocks reusable) only once every receive has completed or
  failed, and memory that is reused is never written into afterwards. When a sender's
  control connection breaks mid-write (before ``done``), the transfer fails and the
  receiver completes its own pending receives: it sends scratch bytes of their sizes,
  with their tags, to its own worker; bytes of that sender's that still come find no
  receive and never reach the blocks. A sender that said ``done`` has finished its sends
  and may exit while its bytes are still on the way: those get ``lost_sender_grace_s``
  to land before the transfer fails the same way.
- A write announced for a transfer this receiver no longer has is received into scratch
  memory and dropped, so the sender's sends complete. ``write`` carries the tag, the
  block count and the run lengths (none: staged), enough to drain it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dynask.kv.gpu.block_copy import copy_blocks
from dynask.kv.transfer import BlockClaim, TransferId
from dynask.kv.transport.control import ControlledBlockTransport, Incoming, Peer, tell
from dynask.kv.transport.cuda_ipc import bind_device
from dynask.kv.transport.ucxx_tensor import ucxx_buffer, ucxx_module

INDEX_BITS = 20  # messages of one transfer: tensors x segments < 2**20
# Receiver runs up to which a write goes straight into the blocks; more are staged. Every
# write is direct by default: a staged write crashed the receiving process on the H200
# (module docstring), so staging is only there to be measured (bench.disaggregation).
DIRECT_MAX_RUNS = 1 << INDEX_BITS
UNBLOCK_TIMEOUT_S = 30.0  # completing a gone sender's receives from this worker
LOST_SENDER_GRACE_S = 10.0  # for the bytes of a sender that said done, then disconnected


def plan_segments(src_ids: Sequence[int], dst_ids: Sequence[int]) -> tuple[list[int], bool]:
    """The lengths of the runs of ``dst_ids`` that are contiguous (consecutive ids), and
    whether ``src_ids`` break one of them (then the sender gathers its blocks first)."""
    lengths: list[int] = []
    gather = False
    for i, dst in enumerate(dst_ids):
        if i and dst == dst_ids[i - 1] + 1:
            lengths[-1] += 1
            gather = gather or src_ids[i] != src_ids[i - 1] + 1
        else:
            lengths.append(1)
    return lengths, gather


def segment_starts(ids: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """The first id of each segment; ``ValueError`` when a segment is not contiguous."""
    starts, offset = [], 0
    for length in lengths:
        run = ids[offset : offset + length]
        if length < 1 or len(run) != length or run[-1] - run[0] != length - 1:
            raise ValueError(f"blocks {list(run)} are not one contiguous run of {length}")
        starts.append(run[0])
        offset += length
    if offset != len(ids):
        raise ValueError(f"the segments cover {offset} blocks; {len(ids)} are reserved")
    return starts


def _row_bytes(caches: Sequence[torch.Tensor]) -> list[int]:
    return [t[0].numel() * t.element_size() for t in caches]


def _views(flat: torch.Tensor, caches: Sequence[torch.Tensor], count: int) -> list[torch.Tensor]:
    """``count`` blocks of every cache tensor, one after the other in the bytes ``flat``
    (the layout of a staged write on both sides)."""
    views, offset = [], 0
    for tensor, row in zip(caches, _row_bytes(caches), strict=True):
        part = flat[offset : offset + count * row]
        views.append(part.view(tensor.dtype).view(count, *tensor.shape[1:]))
        offset += count * row
    return views


def _gathered(
    caches: Sequence[torch.Tensor], ids: list[int]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``ids`` of every cache tensor, copied into one new buffer on its device (one fused
    copy): the bytes and their per-tensor views."""
    flat = torch.empty(
        sum(_row_bytes(caches)) * len(ids), dtype=torch.uint8, device=caches[0].device
    )
    views = _views(flat, caches, len(ids))
    bind_device(caches[0].device)
    copy_blocks(caches, ids, views, list(range(len(ids))))
    return flat, views


def _scattered(flat: torch.Tensor, caches: Sequence[torch.Tensor], ids: list[int]) -> None:
    """A staged write's bytes into blocks ``ids`` of ``caches`` (one fused copy)."""
    bind_device(caches[0].device)
    copy_blocks(_views(flat, caches, len(ids)), list(range(len(ids))), caches, ids)


@dataclass(frozen=True)
class PostedReceive:
    """One receive posted on this worker for a transfer's message."""

    tag: int
    nbytes: int
    task: asyncio.Future[Any]


class UCXXBlockTransport(ControlledBlockTransport):
    """Block transport over UCXX (see the module docstring)."""

    name = "ucxx"
    NO_ANSWER = ("done", "abort", "write")

    def __init__(self, direct_max_runs: int = DIRECT_MAX_RUNS) -> None:
        super().__init__()
        self.direct_max_runs = direct_max_runs  # a sender's choice; more runs: staged
        self._ucxx = ucxx_module()
        self._caches: list[torch.Tensor] = []
        self._rows: list[int] = []  # bytes of one block of each cache tensor
        self._tags: dict[TransferId, int] = {}
        self._posted: dict[TransferId, list[PostedReceive]] = {}
        self._loopback: Any = None  # an endpoint to this process's own UCX worker
        self._unblocking: set[asyncio.Future[None]] = set()
        self.lost_sender_grace_s = LOST_SENDER_GRACE_S

    async def listen(self, host: str) -> str:
        self._ucxx.continuous_ucx_progress()  # the posted receives progress on this loop
        return await super().listen(host)

    def share(self, caches: Sequence[torch.Tensor]) -> None:
        if caches:
            bind_device(caches[0].device)
        self._caches = list(caches)
        self._rows = _row_bytes(self._caches)

    def _offer(self) -> list[Any]:
        if not self._caches:
            raise EOFError("this receiver shares no cache")
        return [self._ucxx.get_worker_address().tobytes(), self._rows]

    def _extras(self, transfer_id: TransferId, incoming: Incoming) -> list[Any]:
        tag = secrets.randbits(64 - INDEX_BITS) << INDEX_BITS
        self._tags[transfer_id] = tag
        return [tag]

    def _settle(self, transfer_id: TransferId) -> None:
        super()._settle(transfer_id)
        if transfer_id not in self._incoming:
            self._tags.pop(transfer_id, None)
            self._posted.pop(transfer_id, None)

    def _announced(self, message: list[Any], incoming: Incoming | None) -> None:
        if message[0] != "write":
            super()._announced(message, incoming)
        transfer_id, sent_tag, count = TransferId(str(message[1])), int(message[2]), int(message[3])
        lengths = [int(n) for n in message[4]]
        tag = self._tags.get(transfer_id)
        if incoming is None or tag != sent_tag or not incoming.writing:
            self._drain(sent_tag, count, lengths)
            return
        if not lengths:  # staged: one message, then one copy into the blocks
            staging = torch.empty(
                sum(self._rows) * count,
                dtype=torch.uint8,
                device=self._caches[0].device,
            )
            posted = [self._post(staging, tag)]
            landing = self._land_staged(posted[0].task, staging, incoming.block_ids)
        else:
            try:
                starts = segment_starts(incoming.block_ids, lengths)
            except ValueError as exc:
                self._drain(sent_tag, count, lengths)
                self._fail(transfer_id, f"the sender's segments do not fit: {exc}")
                return
            posted = [
                self._post(tensor[start : start + length], tag + index)
                for index, (tensor, start, length) in enumerate(
                    (t, s, n) for t in self._caches for s, n in zip(starts, lengths, strict=True)
                )
            ]
            landing = _land([p.task for p in posted])
        self._posted[transfer_id] = posted
        incoming.landing = asyncio.ensure_future(landing)
        incoming.landing.add_done_callback(_retrieved)  # a failure is the transfer's, read there

    def _post(self, destination: torch.Tensor, tag: int) -> PostedReceive:
        task = asyncio.ensure_future(self._ucxx.recv(ucxx_buffer(destination), tag=tag))
        return PostedReceive(tag, destination.numel() * destination.element_size(), task)

    def _sender_gone(self, transfer_ids: list[TransferId]) -> None:
        for transfer_id in transfer_ids:
            incoming = self._incoming.get(transfer_id)
            if incoming is None or incoming.landing is None or incoming.landing.done():
                continue
            if incoming.future.done():  # failed mid-write: its bytes may never come
                self._unblock(transfer_id)
            else:  # it said done: its bytes get a grace period to land
                asyncio.get_running_loop().call_later(
                    self.lost_sender_grace_s, self._give_up_on, transfer_id, incoming
                )

    def _give_up_on(self, transfer_id: TransferId, incoming: Incoming) -> None:
        landing = incoming.landing
        if self._incoming.get(transfer_id) is not incoming or landing is None or landing.done():
            return
        self._fail(
            transfer_id,
            f"its bytes did not land within {self.lost_sender_grace_s:g} s of the "
            "sender's disconnection",
        )
        self._unblock(transfer_id)

    def _unblock(self, transfer_id: TransferId) -> None:
        """Completes the transfer's pending receives from this worker (module docstring)."""
        pending = [p for p in self._posted.get(transfer_id, []) if not p.task.done()]
        if pending:
            sending = asyncio.ensure_future(self._send_to_self(pending))
            self._unblocking.add(sending)
            sending.add_done_callback(self._unblocking.discard)
            sending.add_done_callback(_retrieved)

    async def _send_to_self(self, pending: list[PostedReceive]) -> None:
        if self._loopback is None:
            self._loopback = await self._ucxx.create_endpoint_from_worker_address(
                self._ucxx.get_worker_address()
            )
        scratch = torch.zeros(
            max(p.nbytes for p in pending), dtype=torch.uint8, device=self._caches[0].device
        )
        sends = [
            self._loopback.send(ucxx_buffer(scratch[: p.nbytes]), tag=p.tag, force_tag=True)
            for p in pending
        ]
        await asyncio.wait_for(_land(sends), UNBLOCK_TIMEOUT_S)

    async def _land_staged(self, receive: Any, staging: torch.Tensor, ids: list[int]) -> None:
        await _land([receive])
        if len(ids) * sum(self._rows) != staging.numel():
            raise ValueError(f"a staged write of {staging.numel()} bytes for {len(ids)} blocks")
        await asyncio.to_thread(_scattered, staging, self._caches, ids)

    def _drain(self, tag: int, count: int, lengths: list[int]) -> None:
        """Receives a write nobody expects into scratch memory, so its sends complete."""
        rows = self._rows
        sizes = [row * n for row in rows for n in lengths] if lengths else [sum(rows) * count]
        receives = [
            self._ucxx.recv(np.empty(size, dtype=np.uint8), tag=tag + index)
            for index, size in enumerate(sizes)
        ]
        asyncio.ensure_future(_land(receives)).add_done_callback(_retrieved)

    async def _write(
        self, peer: Peer, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        assert peer.offer is not None
        address, rows = peer.offer[0], list(peer.offer[1])
        if _row_bytes(caches) != rows:
            raise ValueError(
                f"the receiver's cache tensors hold blocks of {rows} bytes; this sender's "
                f"{_row_bytes(caches)}"
            )
        async with peer.writing:
            if peer.opened is None:
                peer.opened = await self._connect(address)
        endpoint, tag, count = peer.opened, int(claim.extras[0]), len(block_ids)
        lengths, gather = plan_segments(block_ids, claim.block_ids)
        if len(lengths) > self.direct_max_runs:  # staged: one message
            flat, _ = await asyncio.to_thread(_gathered, caches, block_ids)
            await tell(peer, ["write", claim.transfer_id, tag, count, []])
            await _land([endpoint.send(ucxx_buffer(flat), tag=tag, force_tag=True)])
            return
        if gather:
            _, sources = await asyncio.to_thread(_gathered, caches, block_ids)
            starts = segment_starts(list(range(count)), lengths)
        else:
            sources, starts = list(caches), segment_starts(block_ids, lengths)
        await tell(peer, ["write", claim.transfer_id, tag, count, lengths])
        sends = [
            endpoint.send(
                ucxx_buffer(tensor[start : start + length]), tag=tag + index, force_tag=True
            )
            for index, (tensor, start, length) in enumerate(
                (t, s, n) for t in sources for s, n in zip(starts, lengths, strict=True)
            )
        ]
        await _land(sends)

    async def _connect(self, address: bytes) -> Any:
        try:
            worker = self._ucxx.get_ucx_address_from_buffer(address)
            return await self._ucxx.create_endpoint_from_worker_address(worker)
        except self._ucxx.exceptions.UCXError as exc:
            raise RuntimeError(f"cannot reach the receiver's UCX worker: {exc}") from exc

    async def close(self) -> None:
        endpoints = [peer.opened for peer in self._peers.values() if peer.opened is not None]
        await super().close()  # fails every transfer; those with pending receives stay
        for transfer_id in list(self._incoming):
            self._unblock(transfer_id)
        await asyncio.gather(*self._unblocking, return_exceptions=True)
        if self._loopback is not None:
            endpoints.append(self._loopback)
        for endpoint in endpoints:
            if not endpoint.closed:
                await endpoint.close()


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _land(operations: list[Any]) -> None:
    """Waits for every send or receive; one that failed fails the whole (after the rest
    finished: a posted receive may write until then)."""
    results = await asyncio.gather(*operations, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(results)} UCX messages failed: {errors[0]}")
