"""KV transports (TCP, UCXX) between two listeners in one process, over real sockets.

UCXX tests run where the ``ucxx-cu12`` wheel is installed (the dev extras install it);
on this CPU-only machine UCX moves the bytes over TCP and shared memory.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import torch

from dynask.kv.transfer import (
    KVTransport,
    TransferError,
    TransferHeader,
    TransferId,
    make_transport,
)
from dynask.kv.transport.tcp import TCPTransport
from tests.system_tools import require_module

KINDS = ["tcp", "ucxx"]


def kv_blocks(blocks: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((2, 2, blocks, 16, 2, 32), generator=generator).to(dtype)


def run_pair(kind: str, body: Callable[[KVTransport, KVTransport, str], Awaitable[None]]) -> None:
    if kind == "ucxx":
        require_module("ucxx", "ucxx-cu12")

    async def main() -> None:
        sender, receiver = make_transport(kind), make_transport(kind)
        address = await receiver.listen("127.0.0.1")
        try:
            await asyncio.wait_for(body(sender, receiver, address), timeout=60)
        finally:
            await sender.close()
            await receiver.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_transfers_arrive_bit_for_bit(kind: str) -> None:
    async def body(sender: KVTransport, receiver: KVTransport, address: str) -> None:
        sent = {TransferId(f"r{i}"): kv_blocks(1 + i, seed=i) for i in range(6)}
        sent[TransferId("bf16")] = kv_blocks(3, seed=9, dtype=torch.bfloat16)
        arrivals = {tid: receiver.expect(tid, torch.empty_like(kv)) for tid, kv in sent.items()}
        await asyncio.gather(*(sender.send(address, tid, kv) for tid, kv in sent.items()))
        for tid, kv in sent.items():
            assert torch.equal(await arrivals[tid], kv), tid

    run_pair(kind, body)


@pytest.mark.parametrize("kind", KINDS)
def test_unexpected_transfer_is_dropped_and_the_next_one_arrives(kind: str) -> None:
    async def body(sender: KVTransport, receiver: KVTransport, address: str) -> None:
        forgotten = receiver.expect(TransferId("late"), torch.empty((2, 2, 4, 16, 2, 32)))
        receiver.forget(TransferId("late"))
        assert forgotten.cancelled()
        await sender.send(address, TransferId("late"), kv_blocks(4, seed=1))
        await sender.send(address, TransferId("never-expected"), kv_blocks(2, seed=2))
        kv = kv_blocks(2, seed=3)
        arrival = receiver.expect(TransferId("next"), torch.empty_like(kv))
        await sender.send(address, TransferId("next"), kv)
        assert torch.equal(await arrival, kv)

    run_pair(kind, body)


@pytest.mark.parametrize("kind", KINDS)
def test_shape_mismatch_fails_that_transfer_only(kind: str) -> None:
    async def body(sender: KVTransport, receiver: KVTransport, address: str) -> None:
        wrong = receiver.expect(TransferId("a"), torch.empty((2, 2, 5, 16, 2, 32)))
        await sender.send(address, TransferId("a"), kv_blocks(4, seed=1))
        with pytest.raises(TransferError, match=r"sent float32\[2, 2, 4, 16, 2, 32\]"):
            await wrong
        kv = kv_blocks(1, seed=2)
        right = receiver.expect(TransferId("b"), torch.empty_like(kv))
        await sender.send(address, TransferId("b"), kv)
        assert torch.equal(await right, kv)

    run_pair(kind, body)


def test_connection_cut_mid_transfer_fails_the_transfer() -> None:
    async def main() -> None:
        receiver = TCPTransport()
        host, port = (await receiver.listen("127.0.0.1")).rsplit(":", 1)
        kv = kv_blocks(8, seed=4)
        arrival = receiver.expect(TransferId("cut"), torch.empty_like(kv))
        header = TransferHeader.of(TransferId("cut"), kv).pack()
        body = kv.numpy().tobytes()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(struct.pack(">I", len(header)) + header + body[: len(body) // 2])
        with pytest.raises(TransferError, match="transfer cut failed: the connection broke"):
            await asyncio.wait_for(arrival, timeout=10)
        await receiver.close()

    asyncio.run(main())


def test_unreachable_listener_is_a_transfer_error() -> None:
    async def main() -> None:
        sender = TCPTransport()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with pytest.raises(
            TransferError, match=f"cannot reach the KV listener at 127.0.0.1:{port}"
        ):
            await sender.send(f"127.0.0.1:{port}", TransferId("x"), kv_blocks(1, seed=0))
        await sender.close()

    asyncio.run(main())


def test_unknown_transport_names_the_choices() -> None:
    with pytest.raises(
        ValueError, match="KV transport has value 'nccl'; use one of: tcp, ucxx, cuda_ipc"
    ):
        make_transport("nccl")
