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
- The control protocol (claiming the receiver's blocks while the prefill runs, ``done``,
  ``abort``, what a broken connection or a forgotten transfer does) is
  ``kv.transport.control``'s; this transport offers the handles and copies.
- A process cannot open its own CUDA IPC handles (CUDA answers "invalid device
  context"), so the handles name the process that shared them and a sender refuses its
  own with a ``TransferError`` that says so. (A prefill actor that served a request by
  itself and sent its KV to itself failed exactly so on the H200; the orchestrator no
  longer plans that.)
- Several GPUs of one host: CUDA numbers devices per process (``CUDA_VISIBLE_DEVICES``),
  so the handles carry the GPU's UUID and the sender maps it to its own index. The
  GPU must be visible to the sender (``gpu_placement`` rotates the visible list).
"""

from __future__ import annotations

import asyncio
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any
from uuid import uuid4

import torch
import torch.multiprocessing
from torch.multiprocessing.reductions import reduce_tensor

from dynask.kv.gpu.block_copy import BlockCopy, BlockLayout, copy_blocks, launch_blocks
from dynask.kv.transfer import BlockClaim, TransferError
from dynask.kv.transport.control import ControlledBlockTransport, Peer


@dataclass
class _Opened:
    """A receiver's cache as this sender opened it, and where its tensors and ours lie
    (found at the first copy)."""

    caches: list[torch.Tensor]
    layout: BlockLayout | None = None


class IPCTransport(ControlledBlockTransport):
    """Block transport over CUDA IPC / shared memory (see the module docstring)."""

    name = "cuda_ipc"

    def __init__(self) -> None:
        super().__init__()
        self._handles: bytes | None = None

    def share(self, caches: Sequence[torch.Tensor]) -> None:
        """Offers this engine's paged cache tensors (dim 0: block) to senders."""
        if caches:
            bind_device(caches[0].device)
        self._handles = pickle.dumps((process_id(), [_handle(tensor) for tensor in caches]))

    def _offer(self) -> list[Any]:
        if self._handles is None:
            raise EOFError("this receiver shares no cache")
        return [self._handles]

    def _check_offer(self, offer: list[Any]) -> None:
        check_openable(offer)

    async def _write(
        self, peer: Peer, claim: BlockClaim, caches: Sequence[torch.Tensor], block_ids: list[int]
    ) -> None:
        async with peer.writing:
            await _copy(peer, caches, block_ids, claim.block_ids)


def bind_device(device: torch.device) -> None:
    """Makes ``device`` current in this thread (a Dask worker's pool thread starts on
    device 0), so the handles open and the copy runs on the cache's own GPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


async def _copy(
    peer: Peer, caches: Sequence[torch.Tensor], src_ids: list[int], dst_ids: list[int]
) -> None:
    """The copy into the peer's blocks, finished on return (module docstring)."""
    opened: _Opened | None = peer.opened
    if opened is None or opened.layout is None or not opened.layout.fits(caches, opened.caches):
        await asyncio.to_thread(_open_and_copy, peer, caches, src_ids, dst_ids)
        return
    started = launch_blocks(caches, src_ids, opened.caches, dst_ids, opened.layout)
    await wait_for_copy(started)


async def wait_for_copy(started: BlockCopy) -> None:
    """Returns once ``started`` is done, without blocking the event loop: the wait for
    its event runs in a thread while the GPU copies."""
    await asyncio.to_thread(started.wait)


def _open_and_copy(
    peer: Peer, caches: Sequence[torch.Tensor], src_ids: list[int], dst_ids: list[int]
) -> None:
    bind_device(caches[0].device)
    if peer.opened is None:
        assert peer.offer is not None
        peer.opened = _Opened(_open(peer.offer))
    opened = peer.opened
    opened.layout = copy_blocks(caches, src_ids, opened.caches, dst_ids, opened.layout)


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
