"""The ucxx block transport's own rules: how a write is cut into messages, and that a
transfer completes only once its bytes have landed in the reserved blocks (UCX over TCP
here; the protocol they share with cuda_ipc is in test_block_transports.py)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from dynask.kv.transfer import TransferError, TransferId
from dynask.kv.transport.ucxx_blocks import UCXXBlockTransport, plan_segments, segment_starts
from dynask.kv.transport.ucxx_tensor import ucxx_buffer
from tests.kv.test_block_transports import caches
from tests.system_tools import require_module


def test_segments_are_the_receivers_contiguous_runs() -> None:
    assert plan_segments([3, 4, 5, 9], [10, 11, 12, 5]) == ([3, 1], False)
    assert plan_segments([3, 4, 9, 1], [10, 11, 12, 5]) == ([3, 1], True)  # 4 → 9 breaks a run
    assert plan_segments([7, 2, 0], [6, 2, 17]) == ([1, 1, 1], False)  # runs of one never gather
    assert plan_segments([], []) == ([], False)
    assert plan_segments(list(range(8)), list(range(40, 48))) == ([8], False)


def test_segment_starts_check_every_run_and_the_total() -> None:
    assert segment_starts([10, 11, 12, 5], [3, 1]) == [10, 5]
    with pytest.raises(ValueError, match=r"blocks \[10, 11, 5\] are not one contiguous run of 3"):
        segment_starts([10, 11, 5, 6], [3, 1])
    with pytest.raises(ValueError, match="the segments cover 3 blocks; 4 are reserved"):
        segment_starts([10, 11, 12, 5], [3])


async def _control(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _say(writer: asyncio.StreamWriter, message: list[Any]) -> None:
    body = msgpack.packb(message)
    writer.write(struct.pack(">I", len(body)) + body)
    await writer.drain()


async def _hear(reader: asyncio.StreamReader) -> list[Any]:
    size = struct.unpack(">I", await reader.readexactly(4))[0]
    reply: list[Any] = msgpack.unpackb(await reader.readexactly(size))
    return reply


async def _offered(
    receiver: UCXXBlockTransport, cache: list[torch.Tensor]
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter, bytes, list[int]]:
    """``receiver`` listening over ``cache``, and a sender's control connection to it that
    has heard the offer (the receiver's worker address and block rows)."""
    receiver.share(cache)
    address = await receiver.listen("127.0.0.1")
    reader, writer = await _control(address)
    await _say(writer, ["offer"])
    worker_address, rows = await _hear(reader)
    return address, reader, writer, worker_address, rows


async def _begin(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transfer: str, count: int
) -> tuple[list[int], int]:
    """The ``begin`` round trip: the reserved block ids and the transfer's tag base."""
    await _say(writer, ["begin", transfer, count])
    ok, block_ids, tag = await _hear(reader)
    assert ok == "ok"
    return block_ids, tag


def test_done_before_the_bytes_land_completes_only_when_they_have() -> None:
    """A sender's ``done`` may overtake its bytes (eager sends complete before they land):
    the transfer completes, and its blocks are released, only once every posted receive
    has finished; the bytes are in the reserved blocks then."""
    ucxx = require_module("ucxx", "ucxx-cu12")

    async def main() -> tuple[bool, bool, list[torch.Tensor]]:
        receiver, mine = UCXXBlockTransport(), caches(8, seed=None)
        _, reader, writer, worker_address, rows = await _offered(receiver, mine)
        arrived = receiver.expect_blocks(TransferId("t"), [5, 6, 2])
        block_ids, tag = await _begin(reader, writer, "t", 3)
        assert (block_ids, rows) == ([5, 6, 2], [256] * 4)
        await _say(writer, ["write", "t", tag, 3, [2, 1]])
        await _say(writer, ["done", "t"])
        settling = asyncio.ensure_future(receiver.writes_done(TransferId("t")))
        await asyncio.sleep(0.2)
        waited = not arrived.done() and not settling.done()
        source = caches(8, seed=5)
        endpoint = await ucxx.create_endpoint_from_worker_address(
            ucxx.get_ucx_address_from_buffer(worker_address)
        )
        index = 0
        for tensor in source:  # the sender's blocks [0, 1] and [4]
            for start, length in ((0, 2), (4, 1)):
                data = tensor[start : start + length].reshape(-1).view(torch.uint8).numpy()
                await endpoint.send(data, tag=tag + index, force_tag=True)
                index += 1
        await asyncio.wait_for(arrived, 5)
        await asyncio.wait_for(settling, 5)
        await endpoint.close()
        writer.close()
        await receiver.close()
        return waited, arrived.exception() is None, mine

    waited, completed, received = asyncio.run(main())
    assert (waited, completed) == (True, True)
    for mine, theirs in zip(received, caches(8, seed=5), strict=True):
        assert torch.equal(mine[[5, 6, 2]], theirs[[0, 1, 4]])
        assert bool((mine[[0, 1, 3, 4, 7]] == -1).all())


@pytest.mark.parametrize("said_done", [False, True])
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ),
    ],
)
def test_a_sender_gone_before_its_bytes_land_fails_the_transfer_and_frees_its_blocks(
    said_done: bool, device: str
) -> None:
    """A sender announces a write, sends one of its eight messages (and maybe ``done``),
    and its connection breaks: the transfer fails (at once, or after the grace a sender
    that said ``done`` gets for bytes on the way), the receiver completes the pending
    receives itself, and the transfer settles (its blocks reusable), as does a transfer
    still pending when the transport closes."""
    ucxx = require_module("ucxx", "ucxx-cu12")

    async def main() -> tuple[str, bool, bool]:
        receiver = UCXXBlockTransport()
        receiver.lost_sender_grace_s = 0.5
        mine = [t.to(device) for t in caches(8, seed=None)]
        address, reader, writer, worker_address, _ = await _offered(receiver, mine)
        arrived = receiver.expect_blocks(TransferId("t"), [5, 6, 2])
        _, tag = await _begin(reader, writer, "t", 3)
        await _say(writer, ["write", "t", tag, 3, [2, 1]])
        if said_done:
            await _say(writer, ["done", "t"])
        endpoint = await ucxx.create_endpoint_from_worker_address(
            ucxx.get_ucx_address_from_buffer(worker_address)
        )
        data = ucxx_buffer(caches(8, seed=5)[0][0:2].to(device))
        await endpoint.send(data, tag=tag, force_tag=True)  # 1 of 4 tensors x 2 runs
        await endpoint.close()
        writer.close()  # the sender is gone
        with pytest.raises(TransferError) as raised:
            await asyncio.wait_for(arrived, 5)
        await asyncio.wait_for(receiver.writes_done(TransferId("t")), 10)
        settled_after_the_sender = not receiver._incoming

        # A transfer whose write was announced, and nothing sent, when the transport closes.
        later = receiver.expect_blocks(TransferId("u"), [0, 1])
        reader, writer = await _control(address)
        _, tag = await _begin(reader, writer, "u", 2)
        await _say(writer, ["write", "u", tag, 2, [2]])
        await asyncio.sleep(0.1)
        await asyncio.wait_for(receiver.close(), 10)
        writer.close()
        closed = later.done() and later.exception() is not None and not receiver._incoming
        return str(raised.value), settled_after_the_sender, closed

    error, settled, closed = asyncio.run(main())
    assert error == "transfer t failed: " + (
        "its bytes did not land within 0.5 s of the sender's disconnection"
        if said_done
        else "the sender's connection broke mid-write"
    )
    assert (settled, closed) == (True, True)


def test_segments_that_do_not_fit_the_reserved_blocks_fail_the_transfer() -> None:
    require_module("ucxx", "ucxx-cu12")

    async def main() -> BaseException | None:
        receiver = UCXXBlockTransport()
        receiver.share(caches(8, seed=None))
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("t"), [5, 6, 2])
        reader, writer = await _control(address)
        _, tag = await _begin(reader, writer, "t", 3)
        await _say(writer, ["write", "t", tag, 3, [3]])  # 5, 6, 2 is not one run
        await asyncio.wait({arrived}, timeout=5)
        writer.close()
        await receiver.close()
        return arrived.exception()

    error = asyncio.run(main())
    assert isinstance(error, TransferError)
    assert str(error) == (
        "transfer t failed: the sender's segments do not fit: blocks [5, 6, 2] are not one "
        "contiguous run of 3"
    )


@pytest.mark.parametrize("direct_max_runs", [0, 4])
def test_a_fragmented_write_is_staged_in_one_message_and_lands_the_same(
    direct_max_runs: int,
) -> None:
    """More runs than ``direct_max_runs``: one message into a buffer of the receiver's,
    then one copy into the reserved blocks; the blocks hold the same bytes either way,
    and a later write (the staging buffer gone) is not disturbed."""
    require_module("ucxx", "ucxx-cu12")

    async def main() -> list[torch.Tensor]:
        receiver = UCXXBlockTransport()
        mine = caches(20, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        first = receiver.expect_blocks(TransferId("a"), [10, 11, 12, 5])
        second = receiver.expect_blocks(TransferId("b"), [0, 19])
        sender = UCXXBlockTransport(direct_max_runs=direct_max_runs)
        source = caches(16, seed=9)
        assert await sender.send_blocks(address, TransferId("a"), source, [3, 4, 9, 1])
        assert await sender.send_blocks(address, TransferId("b"), source, [15, 0])
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        await sender.close()
        await receiver.close()
        return mine

    received = asyncio.run(main())
    for mine, theirs in zip(received, caches(16, seed=9), strict=True):
        assert torch.equal(mine[[10, 11, 12, 5, 0, 19]], theirs[[3, 4, 9, 1, 15, 0]])
        assert bool((mine[[i for i in range(20) if i not in (10, 11, 12, 5, 0, 19)]] == -1).all())


def test_a_staged_write_nobody_expects_is_drained_and_the_sender_finishes() -> None:
    """A write announced for a transfer this receiver does not hold (a tag it never gave)
    is received into scratch memory, so the sender's send completes (2 MiB: UCX's
    rendezvous waits for a posted receive)."""
    ucxx = require_module("ucxx", "ucxx-cu12")

    async def main() -> bool:
        receiver = UCXXBlockTransport()
        _, _, writer, worker_address, _ = await _offered(receiver, caches(8, seed=None))
        await _say(writer, ["write", "nobody", 7 << 20, 2048, []])
        endpoint = await ucxx.create_endpoint_from_worker_address(
            ucxx.get_ucx_address_from_buffer(worker_address)
        )
        data = np.ones(2048 * 4 * 256, dtype=np.uint8)
        await asyncio.wait_for(endpoint.send(data, tag=7 << 20, force_tag=True), 5)
        await endpoint.close()
        writer.close()
        await receiver.close()
        return True

    assert asyncio.run(main())


def test_caches_of_another_shape_are_refused_before_any_byte_moves() -> None:
    require_module("ucxx", "ucxx-cu12")

    async def main() -> tuple[BaseException | None, str]:
        receiver = UCXXBlockTransport()
        receiver.share(caches(8, seed=None))
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("t"), [1])
        sender = UCXXBlockTransport()
        wrong = [torch.zeros(4, 4, 2, 4) for _ in range(4)]  # blocks of 128 bytes, not 256
        with pytest.raises(TransferError) as raised:
            await sender.send_blocks(address, TransferId("t"), wrong, [0])
        await asyncio.wait({arrived}, timeout=5)
        await sender.close()
        await receiver.close()
        return arrived.exception(), str(raised.value)

    error, raised = asyncio.run(main())
    assert raised == (
        "transfer t: the write failed: the receiver's cache tensors hold blocks of "
        "[256, 256, 256, 256] bytes; this sender's [128, 128, 128, 128]"
    )
    assert str(error) == f"transfer t failed: the sender aborted: {raised.split(': ', 2)[2]}"


def test_np_is_the_buffer_of_a_cpu_cache() -> None:
    """CPU caches go to UCX as zero-copy numpy views of the block slice."""
    tensor = torch.arange(24, dtype=torch.float32).view(6, 4)
    view = ucxx_buffer(tensor[2:4])
    assert isinstance(view, np.ndarray) and view.dtype == np.uint8 and view.size == 32
    view[:4] = np.frombuffer(np.float32(-1).tobytes(), dtype=np.uint8)
    assert tensor[2, 0].item() == -1.0
