"""KV transfer over plain TCP sockets, for machines without UCX.

Frame: a 4-byte big-endian header length, the ``TransferHeader`` (msgpack), then the
tensor's bytes. The receiver reads the body with ``sock_recv_into`` straight into the
expected destination tensor (no intermediate buffer); the sender writes the tensor's
own memory with ``sock_sendall``. One connection per destination, reused, with a lock so
two transfers never interleave on it. CUDA tensors are copied to host memory first.

Why raw non-blocking sockets and not asyncio streams: a ``StreamReader`` copies every
chunk into its own buffer and again into ours; ``sock_recv_into`` writes into the
destination directly (``bench.disaggregation.modes`` compares both against a blocking raw
socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import torch

from dynask.kv.transfer import (
    MAX_HEADER_BYTES,
    Expectations,
    TransferError,
    TransferHeader,
    TransferId,
    byte_view,
)

_LENGTH = struct.Struct(">I")
_SCRATCH_BYTES = 1 << 20
_SOCKET_BUFFER_BYTES = 4 << 20
CONNECT_TIMEOUT_S = 10.0


class TCPTransport:
    """``KVTransport`` over TCP (see the module docstring)."""

    name = "tcp"

    def __init__(self) -> None:
        self.expectations = Expectations()
        self._server: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self._connections: dict[str, tuple[socket.socket, asyncio.Lock]] = {}

    async def listen(self, host: str) -> str:
        server = socket.create_server((host, 0))
        server.setblocking(False)
        self._server = server
        self._accepting = asyncio.create_task(self._accept(server), name="kv-transfer-accept")
        return f"{host}:{server.getsockname()[1]}"

    def expect(self, transfer_id: TransferId, into: torch.Tensor) -> asyncio.Future[torch.Tensor]:
        if into.device.type != "cpu":
            raise ValueError("the TCP transport receives into CPU tensors only")
        return self.expectations.add(transfer_id, into)

    def forget(self, transfer_id: TransferId) -> None:
        self.expectations.forget(transfer_id)

    async def send(self, address: str, transfer_id: TransferId, kv: torch.Tensor) -> None:
        kv = kv.detach().to("cpu").contiguous()
        header = TransferHeader.of(transfer_id, kv).pack()
        sock, lock = await self._connection(address)
        loop = asyncio.get_running_loop()
        async with lock:
            try:
                await loop.sock_sendall(sock, _LENGTH.pack(len(header)) + header)
                await loop.sock_sendall(sock, byte_view(kv))
            except OSError as exc:
                self._drop_connection(address)
                raise TransferError(f"sending transfer {transfer_id} to {address}: {exc}") from exc

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._readers):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for address in list(self._connections):
            self._drop_connection(address)
        self.expectations.fail_all("the transport closed")

    # ---- sending side -----------------------------------------------------------------

    async def _connection(self, address: str) -> tuple[socket.socket, asyncio.Lock]:
        entry = self._connections.get(address)
        if entry is not None:
            return entry
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        try:
            family, kind, proto, _, target = (
                await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            )[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, target), CONNECT_TIMEOUT_S)
            except BaseException:
                sock.close()
                raise
        except (OSError, TimeoutError) as exc:
            raise TransferError(f"cannot reach the KV listener at {address}: {exc}") from exc
        _tune(sock)
        entry = self._connections.setdefault(address, (sock, asyncio.Lock()))
        if entry[0] is not sock:
            sock.close()  # another send connected meanwhile
        return entry

    def _drop_connection(self, address: str) -> None:
        entry = self._connections.pop(address, None)
        if entry is not None:
            entry[0].close()

    # ---- receiving side ---------------------------------------------------------------

    async def _accept(self, server: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(server)
            _tune(sock)
            sock.setblocking(False)
            task = asyncio.create_task(self._read(sock), name="kv-transfer-read")
            self._readers.add(task)
            task.add_done_callback(self._readers.discard)

    async def _read(self, sock: socket.socket) -> None:
        """Reads transfers from one sender until it closes the connection."""
        header: TransferHeader | None = None
        try:
            while True:
                size_bytes = await _recv_exact(sock, _LENGTH.size, allow_eof=True)
                if size_bytes is None:
                    return
                (size,) = _LENGTH.unpack(size_bytes)
                if size > MAX_HEADER_BYTES:
                    raise TransferError(f"KV transfer header of {size} bytes is too large")
                header = TransferHeader.unpack(await _recv_exact(sock, size) or b"")
                destination = self.expectations.destination(header)
                if destination is None:
                    await _discard(sock, header.nbytes)
                else:
                    await _recv_into(sock, byte_view(destination))
                    self.expectations.complete(header.transfer_id)
                header = None
        except (OSError, TransferError, EOFError) as exc:
            if header is not None:
                self.expectations.fail(header.transfer_id, f"the connection broke: {exc}")
        finally:
            sock.close()


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER_BYTES)


async def _recv_exact(sock: socket.socket, size: int, allow_eof: bool = False) -> bytes | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    loop = asyncio.get_running_loop()
    received = 0
    while received < size:
        count = await loop.sock_recv_into(sock, view[received:])
        if count == 0:
            if allow_eof and received == 0:
                return None
            raise EOFError(f"the sender closed after {received} of {size} bytes")
        received += count
    return bytes(buffer)


async def _recv_into(sock: socket.socket, view: memoryview) -> None:
    loop = asyncio.get_running_loop()
    received, size = 0, len(view)
    while received < size:
        count = await loop.sock_recv_into(sock, view[received:])
        if count == 0:
            raise EOFError(f"the sender closed after {received} of {size} bytes")
        received += count


async def _discard(sock: socket.socket, size: int) -> None:
    scratch = memoryview(bytearray(min(size, _SCRATCH_BYTES)))
    remaining = size
    while remaining > 0:
        chunk = min(remaining, len(scratch))
        await _recv_into(sock, scratch[:chunk])
        remaining -= chunk
