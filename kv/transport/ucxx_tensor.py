"""KV transfer over UCXX (UCX's Python binding): tagged send/receive between listeners.

Each transfer is two tagged messages on one endpoint: a fixed-size header frame (a
4-byte length, then the msgpack ``TransferHeader``) and the body. UCX matches messages
of one tag in order, and one lock per endpoint keeps a transfer's two messages
together. The body is received straight into the expected tensor: a CPU tensor as a
zero-copy numpy view, a CUDA tensor as itself (``__cuda_array_interface__``), so UCX
moves GPU memory directly (NVLink / cuda_ipc / RDMA where UCX finds them). On a machine
without GPUs or InfiniBand UCX uses TCP and shared memory, which is what the CPU tests
exercise.

Only the KV transfers use UCX: Dask's own comms stay on TCP (measured on this project's
machines, ``--protocol ucxx`` made actor calls 4x slower and cost each idle process 30%
of a core).
"""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

import numpy as np
import torch

from dynask.kv.transfer import (
    MAX_HEADER_BYTES,
    Expectations,
    TransferError,
    TransferHeader,
    TransferId,
)

_LENGTH = struct.Struct(">I")
_FRAME_BYTES = _LENGTH.size + MAX_HEADER_BYTES


def ucxx_module() -> Any:
    """The ``ucxx`` module; ``ValueError`` saying how to install it.

    UCX's memory-event hooks (UCM patching CUDA's allocation calls) are turned off unless
    the environment says otherwise: on the H200 (torch 2.11, UCX 1.21) every process that
    held torch CUDA memory died with SIGSEGV on its first UCX send with them on, and wrote
    correctly with ``UCX_MEM_EVENTS=no`` (``bench/disaggregation/ucxx_probe.py``). UCX
    then cannot see frees; the paged caches it moves live as long as their engine."""
    os.environ.setdefault("UCX_MEM_EVENTS", "no")  # read when UCX's context is created
    try:
        import ucxx
    except ImportError as exc:
        raise ValueError(
            "the ucxx KV transport needs the UCXX wheels: pip install ucxx-cu12 (or ucxx-cu13); "
            "or use --kv-transport tcp"
        ) from exc
    return ucxx


def ucxx_buffer(tensor: torch.Tensor) -> Any:
    """What UCXX sends from or receives into: the bytes of a contiguous tensor (a numpy
    view on a CPU; on a GPU the tensor, as bytes, since bfloat16 has no array type)."""
    flat = tensor.reshape(-1).view(torch.uint8)
    return flat if flat.device.type == "cuda" else flat.numpy()


class UCXXTransport:
    """``KVTransport`` over UCXX (see the module docstring)."""

    name = "ucxx"

    def __init__(self) -> None:
        self.expectations = Expectations()
        self._ucxx = ucxx_module()
        self._listener: Any = None
        self._endpoints: dict[str, tuple[Any, asyncio.Lock]] = {}
        self._handlers: set[Any] = set()

    async def listen(self, host: str) -> str:
        self._listener = self._ucxx.create_listener(self._serve)
        return f"{host}:{self._listener.port}"

    def expect(self, transfer_id: TransferId, into: torch.Tensor) -> asyncio.Future[torch.Tensor]:
        return self.expectations.add(transfer_id, into)

    def forget(self, transfer_id: TransferId) -> None:
        self.expectations.forget(transfer_id)

    async def send(self, address: str, transfer_id: TransferId, kv: torch.Tensor) -> None:
        kv = kv.detach().contiguous()
        header = TransferHeader.of(transfer_id, kv).pack()
        frame = np.zeros(_FRAME_BYTES, dtype=np.uint8)
        frame[: _LENGTH.size + len(header)] = np.frombuffer(
            _LENGTH.pack(len(header)) + header, dtype=np.uint8
        )
        endpoint, lock = await self._endpoint(address)
        async with lock:
            try:
                await endpoint.send(frame)
                await endpoint.send(ucxx_buffer(kv))
            except self._ucxx.exceptions.UCXError as exc:
                self._endpoints.pop(address, None)
                raise TransferError(f"sending transfer {transfer_id} to {address}: {exc}") from exc

    async def close(self) -> None:
        for endpoint, _ in list(self._endpoints.values()):
            await endpoint.close()
        self._endpoints.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.expectations.fail_all("the transport closed")

    async def _endpoint(self, address: str) -> tuple[Any, asyncio.Lock]:
        entry = self._endpoints.get(address)
        if entry is not None and not entry[0].closed:
            return entry
        host, port = address.rsplit(":", 1)
        try:
            endpoint = await self._ucxx.create_endpoint(host, int(port))
        except self._ucxx.exceptions.UCXError as exc:
            raise TransferError(f"cannot reach the KV listener at {address}: {exc}") from exc
        entry = (endpoint, asyncio.Lock())
        self._endpoints[address] = entry
        return entry

    async def _serve(self, endpoint: Any) -> None:
        """Listener callback: reads transfers from one sender until it goes away."""
        header: TransferHeader | None = None
        frame = np.empty(_FRAME_BYTES, dtype=np.uint8)
        try:
            while True:
                await endpoint.recv(frame)
                (size,) = _LENGTH.unpack(frame[: _LENGTH.size].tobytes())
                if size > MAX_HEADER_BYTES:
                    raise TransferError(f"KV transfer header of {size} bytes is too large")
                header = TransferHeader.unpack(frame[_LENGTH.size : _LENGTH.size + size].tobytes())
                destination = self.expectations.destination(header)
                if destination is None:
                    await endpoint.recv(np.empty(header.nbytes, dtype=np.uint8))
                else:
                    await endpoint.recv(ucxx_buffer(destination))
                    self.expectations.complete(header.transfer_id)
                header = None
        except (self._ucxx.exceptions.UCXError, TransferError) as exc:
            if header is not None:
                self.expectations.fail(header.transfer_id, f"the endpoint failed: {exc}")
