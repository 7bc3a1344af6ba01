"""The block transports on a CPU, each through the same protocol tests: ``cuda_ipc`` with
the paged cache in POSIX shared memory instead of CUDA IPC memory (the CUDA run is in
tests/kv/test_transfer_ipc_cuda.py, on the H200), ``ucxx`` with UCX over TCP / shared
memory receiving into the cache tensors' slices.

The sender runs in a second process, as a prefill engine's worker does; blocks land in
the receiver's reserved block ids, nowhere else; a sender the receiver no longer expects
writes nothing; a connection that breaks mid-write fails the transfer.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import sys
import textwrap

import msgpack
import pytest
import torch

from dynask.kv.transfer import TransferError, TransferId, make_transport
from dynask.kv.transport.control import ControlledBlockTransport
from dynask.kv.transport.cuda_ipc import check_openable, process_id
from tests.system_tools import require_module

KINDS = ["cuda_ipc", "ucxx"]


def transport(kind: str) -> ControlledBlockTransport:
    """The transport an engine actor makes (``UCXX_DIRECT_MAX_RUNS``: the ucxx sender's
    choice between direct and staged writes, for the GPU runs)."""
    if kind == "ucxx":
        require_module("ucxx", "ucxx-cu12")
    made = make_transport(kind, paged_cache=True)
    if "UCXX_DIRECT_MAX_RUNS" in os.environ:
        made.direct_max_runs = int(os.environ["UCXX_DIRECT_MAX_RUNS"])  # type: ignore[attr-defined]
    assert isinstance(made, ControlledBlockTransport)
    return made


BLOCK_SHAPE = (4, 2, 8)  # block_size, kv_heads, head_dim


def caches(num_blocks: int, seed: int | None) -> list[torch.Tensor]:
    """Two layers' K and V; random (``seed``) or poisoned with -1."""
    if seed is None:
        return [torch.full((num_blocks, *BLOCK_SHAPE), -1.0) for _ in range(4)]
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn((num_blocks, *BLOCK_SHAPE), generator=generator) for _ in range(4)]


SENDER = textwrap.dedent(
    """
    import asyncio, sys, torch
    from tests.kv.test_block_transports import caches, transport

    async def main():
        sender = transport(sys.argv[3])
        ok = await sender.send_blocks(sys.argv[1], sys.argv[2], caches(16, seed=7), [3, 4, 9, 1])
        await sender.close()
        print("sent" if ok else "unwanted")

    asyncio.run(main())
    """
)


async def run_sender(address: str, transfer_id: str, kind: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SENDER, address, transfer_id, kind, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert process.returncode == 0
    return out.decode().strip()


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_process_writes_straight_into_the_reserved_blocks(kind: str) -> None:
    async def main() -> tuple[str, list[torch.Tensor]]:
        receiver = transport(kind)
        mine = caches(20, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("r1"), [10, 11, 12, 5])
        outcome = await run_sender(address, "r1", kind)
        await asyncio.wait_for(arrived, 10)
        await receiver.close()
        return outcome, mine

    outcome, received = asyncio.run(main())
    source = caches(16, seed=7)
    assert outcome == "sent"
    for mine, theirs in zip(received, source, strict=True):
        assert torch.equal(mine[[10, 11, 12, 5]], theirs[[3, 4, 9, 1]])
        untouched = [i for i in range(20) if i not in (10, 11, 12, 5)]
        assert bool((mine[untouched] == -1).all())


@pytest.mark.parametrize("kind", KINDS)
def test_a_sender_the_receiver_gave_up_on_writes_nothing(kind: str) -> None:
    async def main() -> tuple[str, list[torch.Tensor], bool]:
        receiver = transport(kind)
        mine = caches(20, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("late"), [1, 2, 3, 4])
        receiver.forget(TransferId("late"))  # the decode side timed out
        outcome = await run_sender(address, "late", kind)
        await receiver.close()
        return outcome, mine, arrived.cancelled()

    outcome, received, cancelled = asyncio.run(main())
    assert (outcome, cancelled) == ("unwanted", True)
    assert all(bool((t == -1).all()) for t in received)


@pytest.mark.parametrize("kind", KINDS)
def test_a_connection_cut_mid_write_fails_the_transfer_and_settles_it(kind: str) -> None:
    async def main() -> str:
        receiver = transport(kind)
        receiver.share(caches(8, seed=None))
        address = await receiver.listen("127.0.0.1")
        transfer_id = TransferId("cut")
        arrived = receiver.expect_blocks(transfer_id, [1, 2])
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        begin = msgpack.packb(["begin", "cut", 2])
        writer.write(struct.pack(">I", len(begin)) + begin)
        await writer.drain()
        reply = msgpack.unpackb(
            await reader.readexactly(struct.unpack(">I", await reader.readexactly(4))[0])
        )
        assert reply[:2] == ["ok", [1, 2]]
        receiver.forget(transfer_id)  # a timeout during the write: the blocks stay claimed
        settling = asyncio.ensure_future(receiver.writes_done(transfer_id))
        await asyncio.sleep(0.05)
        assert not settling.done()
        writer.close()  # the sender dies mid-write
        await asyncio.wait_for(settling, 5)
        await receiver.close()
        return "cancelled" if arrived.cancelled() else str(arrived.exception())

    assert asyncio.run(main()) == "cancelled"


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_count_mismatch_fails_with_both_counts(kind: str) -> None:
    async def main() -> BaseException | None:
        receiver = transport(kind)
        receiver.share(caches(8, seed=None))
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("m"), [1, 2, 3])
        sender = transport(kind)
        sent = await sender.send_blocks(address, TransferId("m"), caches(8, seed=1), [0, 1])
        assert sent is False
        await sender.close()
        await receiver.close()
        return arrived.exception()

    error = asyncio.run(main())
    assert isinstance(error, TransferError)
    assert str(error) == "transfer m failed: the sender has 2 blocks; 3 are reserved"


def test_cuda_handles_shared_by_this_very_process_are_refused_by_name() -> None:
    """CUDA IPC cannot open a process's own memory ('invalid device context' on the
    H200, when a prefill actor sent to itself); the sender says so before writing."""
    cuda = [("cuda", ("GPU-uuid", b"handle"))]
    with pytest.raises(TransferError, match="shared by this very process; CUDA IPC cannot"):
        check_openable([pickle.dumps((process_id(), cuda))])
    check_openable([pickle.dumps(("4242-another-process", cuda))])
    check_openable([pickle.dumps((process_id(), [("cpu", b"shared memory")]))])


@pytest.mark.parametrize("kind", KINDS)
def test_a_claim_made_before_the_kv_exists_is_written_later_into_the_same_blocks(kind: str) -> None:
    async def main() -> tuple[list[int], bool, list[torch.Tensor]]:
        receiver = transport(kind)
        mine = caches(20, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("early"), [6, 2, 17])
        sender = transport(kind)
        claim = await sender.claim(address, TransferId("early"), 3)
        assert claim is not None
        waiting_before_write = not arrived.done()
        await sender.write_claimed(claim, caches(16, seed=3), [0, 5, 9])
        await asyncio.wait_for(arrived, 5)
        await sender.close()
        await receiver.close()
        return claim.block_ids, waiting_before_write, mine

    block_ids, waiting_before_write, received = asyncio.run(main())
    source = caches(16, seed=3)
    assert (block_ids, waiting_before_write) == ([6, 2, 17], True)
    for mine, theirs in zip(received, source, strict=True):
        assert torch.equal(mine[[6, 2, 17]], theirs[[0, 5, 9]])
        assert bool((mine[[i for i in range(20) if i not in (6, 2, 17)]] == -1).all())


@pytest.mark.parametrize("kind", KINDS)
def test_a_released_claim_fails_the_transfer_with_its_reason_and_writes_nothing(kind: str) -> None:
    async def main() -> tuple[BaseException | None, list[torch.Tensor]]:
        receiver = transport(kind)
        mine = caches(8, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("given-back"), [1, 2])
        sender = transport(kind)
        claim = await sender.claim(address, TransferId("given-back"), 2)
        assert claim is not None
        await sender.release_claim(claim, "the prefill took longer than 5 s")
        await asyncio.wait({arrived}, timeout=5)
        await sender.close()
        await receiver.close()
        return arrived.exception(), mine

    error, received = asyncio.run(main())
    assert isinstance(error, TransferError)
    assert str(error) == (
        "transfer given-back failed: the sender aborted: the prefill took longer than 5 s"
    )
    assert all(bool((t == -1).all()) for t in received)


@pytest.mark.parametrize("kind", KINDS)
def test_a_forgotten_claim_keeps_its_blocks_until_the_sender_is_done(kind: str) -> None:
    async def main() -> tuple[bool, bool, bool]:
        receiver = transport(kind)
        receiver.share(caches(8, seed=None))
        address = await receiver.listen("127.0.0.1")
        arrived = receiver.expect_blocks(TransferId("slow"), [3])
        sender = transport(kind)
        claim = await sender.claim(address, TransferId("slow"), 1)
        assert claim is not None
        receiver.forget(TransferId("slow"))  # the decode side timed out meanwhile
        settling = asyncio.ensure_future(receiver.writes_done(TransferId("slow")))
        await asyncio.sleep(0.05)
        held = not settling.done()
        await sender.write_claimed(claim, caches(4, seed=1), [2])
        await asyncio.wait_for(settling, 5)
        unexpected = await sender.claim(address, TransferId("never-expected"), 1)
        await sender.close()
        await receiver.close()
        return held, arrived.cancelled(), unexpected is None

    assert asyncio.run(main()) == (True, True, True)
