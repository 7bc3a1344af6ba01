"""KV transfer bandwidth between two processes: our TCP and UCXX transports against a
blocking raw-socket baseline, in the same run (part 1 of ``bench/disaggregation/modes.py``;
with CUDA devices, ``bench/disaggregation/gpu.py`` uses it for UCXX between two GPUs).

The receiver is a child process. For every transfer the sender first tells it (over a
multiprocessing pipe) what to expect; the receiver preallocates the destination tensor,
registers it and says "ready"; the clock starts, the sender sends, and it stops when the
receiver reports the tensor complete. So each figure is one whole transfer, from the
first byte sent to the last byte in the destination, as a decode actor would see it.
The raw baseline: one blocking TCP socket, ``sendall`` of the bytes and ``recv_into`` a
preallocated buffer, acknowledged with one byte. The methods take turns within every
repeat, so a machine that gets busier or quieter weighs on all of them alike; the
ratio to the raw socket is taken per repeat, then the median.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from dynask.kv.transfer import KVTransport, TransferId, make_tensor_transport

MiB = 1 << 20
RAW = "raw socket"


@dataclass
class BandwidthRow:
    transport: str
    size_mib: int
    gbps_median: float  # GB/s (1e9 bytes), median of the repeats
    gbps_best: float
    ratio_to_baseline: float  # median over repeats of (this / the baseline, same repeat)
    repeats: int


def kv_of(size_mib: int, device: str = "cpu") -> torch.Tensor:
    """A float32 tensor of ``size_mib`` MiB, shaped as that many 1-MiB KV blocks."""
    return torch.ones((size_mib, 16, 16384), device=device)


# ---- receiver process -----------------------------------------------------------------


def _receiver(conn: Connection, kinds: list[str], device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # the CUDA context exists before UCX starts
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    transports: dict[str, KVTransport] = {}
    for kind in kinds:
        transport = make_tensor_transport(kind)
        address = asyncio.run_coroutine_threadsafe(transport.listen("127.0.0.1"), loop).result()
        transports[kind] = transport
        conn.send((kind, address))
    raw = socket.create_server(("127.0.0.1", 0))
    conn.send((RAW, f"127.0.0.1:{raw.getsockname()[1]}"))
    threading.Thread(target=_raw_receiver, args=(raw,), daemon=True).start()
    while (message := conn.recv()) is not None:
        kind, transfer_id, shape = message
        into = torch.empty(shape, device=device)
        arrival = asyncio.run_coroutine_threadsafe(
            _expect(transports[kind], TransferId(transfer_id), into), loop
        ).result()
        conn.send("ready")
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(_await(arrival), 120), loop).result()
        if into.is_cuda:
            torch.cuda.synchronize(into.device)
        conn.send("done")
    for transport in transports.values():
        asyncio.run_coroutine_threadsafe(transport.close(), loop).result()


async def _expect(transport: KVTransport, transfer_id: TransferId, into: torch.Tensor) -> Any:
    return transport.expect(transfer_id, into)


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


def measure(
    kinds: list[str],
    sizes_mib: list[int],
    repeats: int,
    devices: tuple[str, str] = ("cpu", "cpu"),
    baseline: tuple[str, Callable[[torch.Tensor], None]] | None = None,
) -> list[BandwidthRow]:
    """Rows per size: the baseline (default: the raw socket; or ``(name, copy)`` timing
    ``copy(kv)`` here), then each transport, from ``devices[0]`` here to ``devices[1]``
    in a child process."""
    sender_device, receiver_device = devices
    if sender_device.startswith("cuda"):
        torch.cuda.set_device(sender_device)
        torch.empty(1, device=sender_device)
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_receiver, args=(child, kinds, receiver_device))
    process.start()
    addresses = dict(parent.recv() for _ in range(len(kinds) + 1))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    senders = {kind: make_tensor_transport(kind) for kind in kinds}
    rows = []
    try:
        for size in sizes_mib:
            kv = kv_of(size, sender_device)
            name, copy = baseline or (RAW, _raw_sender(addresses[RAW]))
            times: dict[str, list[float]] = {name: [], **{kind: [] for kind in kinds}}
            for repeat in range(repeats + 1):  # the first round warms connections up
                elapsed = {name: _timed(copy, kv)}
                for kind in kinds:
                    elapsed[kind] = _transport_time(
                        parent, loop, senders[kind], addresses, kind, kv
                    )
                if repeat:
                    for key, seconds in elapsed.items():
                        times[key].append(seconds)
            rows += [_row(key, size, kv, times[key], times[name]) for key in times]
    finally:
        parent.send(None)
        process.join(timeout=30)
        for transport in senders.values():
            asyncio.run_coroutine_threadsafe(transport.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    return rows


def _transport_time(
    pipe: Connection,
    loop: asyncio.AbstractEventLoop,
    sender: KVTransport,
    addresses: dict[str, str],
    kind: str,
    kv: torch.Tensor,
) -> float:
    transfer_id = f"{kind}-{time.monotonic_ns()}"
    pipe.send((kind, transfer_id, tuple(kv.shape)))
    if pipe.recv() != "ready":
        raise RuntimeError("the receiver did not get ready")
    if kv.is_cuda:
        torch.cuda.synchronize(kv.device)
    start = time.perf_counter()
    sending = sender.send(addresses[kind], TransferId(transfer_id), kv)
    asyncio.run_coroutine_threadsafe(sending, loop).result()
    if pipe.recv() != "done":
        raise RuntimeError("the receiver did not finish")
    return time.perf_counter() - start


def _raw_sender(address: str) -> Callable[[torch.Tensor], None]:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(kv: torch.Tensor) -> None:
        payload = kv.numpy().data.cast("B")
        sock.sendall(len(payload).to_bytes(8, "big"))
        sock.sendall(payload)
        if sock.recv(1) != b"k":
            raise RuntimeError("the raw receiver did not acknowledge")

    return send


def _timed(copy: Callable[[torch.Tensor], None], kv: torch.Tensor) -> float:
    start = time.perf_counter()
    copy(kv)
    return time.perf_counter() - start


def _row(
    name: str, size: int, kv: torch.Tensor, times: list[float], baseline: list[float]
) -> BandwidthRow:
    nbytes = kv.numel() * kv.element_size()
    rates = [nbytes / t / 1e9 for t in times]
    ratios = [base / t for t, base in zip(times, baseline, strict=True)]
    return BandwidthRow(
        name, size, statistics.median(rates), max(rates), statistics.median(ratios), len(times)
    )
