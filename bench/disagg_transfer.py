"""KV transfer bandwidth between two processes: our TCP and UCXX transports against a
blocking raw-socket baseline, in the same run (part 1 of ``bench/disagg.py``).

The receiver is a child process. For every transfer the sender first tells it (over a
multiprocessing pipe) what to expect; the receiver preallocates the destination tensor,
registers it and says "ready"; the clock starts, the sender sends, and it stops when the
receiver reports the tensor complete. So each figure is one whole transfer, from the
first byte sent to the last byte in the destination, as a decode actor would see it.
The raw baseline: one blocking TCP socket, ``sendall`` of the bytes and ``recv_into`` a
preallocated buffer, acknowledged with one byte.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from dynask.kv.transfer import TransferId, make_transport

MiB = 1 << 20


@dataclass
class BandwidthRow:
    transport: str
    size_mib: int
    gbps_median: float  # GB/s (1e9 bytes), median of the repeats
    gbps_best: float
    repeats: int


def kv_of(size_mib: int, device: str = "cpu") -> torch.Tensor:
    """A KV-shaped float32 tensor of ``size_mib`` MiB (1 MiB per block: 16 tokens × 16 KiB)."""
    return torch.ones((size_mib, 16, 16384), device=device)


# ---- receiver process -----------------------------------------------------------------


def _receiver(conn: Connection, kinds: list[str]) -> None:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    transports = {}
    for kind in kinds:
        transport = make_transport(kind)
        address = asyncio.run_coroutine_threadsafe(transport.listen("127.0.0.1"), loop).result()
        transports[kind] = transport
        conn.send((kind, address))
    raw = socket.create_server(("127.0.0.1", 0))
    conn.send(("raw", f"127.0.0.1:{raw.getsockname()[1]}"))
    threading.Thread(target=_raw_receiver, args=(raw,), daemon=True).start()
    while True:
        message = conn.recv()
        if message is None:
            return
        kind, transfer_id, shape = message
        into = torch.empty(shape)

        async def expect(kind: str = kind, tid: str = transfer_id, into: Any = into) -> Any:
            return transports[kind].expect(TransferId(tid), into)

        arrival = asyncio.run_coroutine_threadsafe(expect(), loop).result()
        conn.send("ready")
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(_await(arrival), 120), loop).result()
        conn.send("done")


async def _await(future: Any) -> None:
    await future


def _raw_receiver(server: socket.socket) -> None:
    while True:
        sock, _ = server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _raw_connection(sock)


def _raw_connection(sock: socket.socket) -> None:
    while True:
        header = sock.recv(8, socket.MSG_WAITALL)
        if len(header) < 8:
            return
        size = int.from_bytes(header, "big")
        buffer = memoryview(bytearray(size))
        received = 0
        while received < size:
            received += sock.recv_into(buffer[received:])
        sock.sendall(b"k")


# ---- sender (this process) ------------------------------------------------------------


def measure(kinds: list[str], sizes_mib: list[int], repeats: int) -> list[BandwidthRow]:
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_receiver, args=(child, kinds), daemon=True)
    process.start()
    addresses = dict(parent.recv() for _ in range(len(kinds) + 1))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    senders = {kind: make_transport(kind) for kind in kinds}
    rows = []
    try:
        for size in sizes_mib:
            kv = kv_of(size)
            rows.append(_raw_row(addresses["raw"], kv, size, repeats))
            for kind in kinds:
                times = []
                for repeat in range(repeats + 1):  # the first warms the connection up
                    tid = f"{kind}-{size}-{repeat}"
                    parent.send((kind, tid, tuple(kv.shape)))
                    assert parent.recv() == "ready"
                    start = time.perf_counter()
                    sending = senders[kind].send(addresses[kind], TransferId(tid), kv)
                    asyncio.run_coroutine_threadsafe(sending, loop).result()
                    assert parent.recv() == "done"
                    if repeat:
                        times.append(time.perf_counter() - start)
                rows.append(_row(kind, size, kv, times))
    finally:
        parent.send(None)
        process.join(timeout=10)
        for transport in senders.values():
            asyncio.run_coroutine_threadsafe(transport.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    return rows


def _raw_row(address: str, kv: torch.Tensor, size: int, repeats: int) -> BandwidthRow:
    host, port = address.rsplit(":", 1)
    payload = memoryview(kv.numpy()).cast("B")
    times = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for repeat in range(repeats + 1):
            start = time.perf_counter()
            sock.sendall(len(payload).to_bytes(8, "big"))
            sock.sendall(payload)
            assert sock.recv(1) == b"k"
            if repeat:
                times.append(time.perf_counter() - start)
    return _row("raw socket", size, kv, times)


def _row(name: str, size: int, kv: torch.Tensor, times: list[float]) -> BandwidthRow:
    nbytes = kv.numel() * kv.element_size()
    rates = [nbytes / t / 1e9 for t in times]
    return BandwidthRow(name, size, statistics.median(rates), max(rates), len(times))
