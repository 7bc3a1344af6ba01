"""The block transports on a GPU: a second process writes its CUDA blocks straight into
this process's reserved CUDA blocks. ``cuda_ipc``: CUDA IPC handles of the paged cache;
the first transfer opens the handles in a thread, the second is launched on the
sender's event loop with the layout kept from the first. ``ucxx``: UCX moves each run
of blocks into the posted slice of the cache (the fragmented plan is gathered on the
sender first). Runs on the H200 (``bench/disaggregation/gpu_serving.sh``, which unpacks
the CUDA 13 UCXX wheels); a machine without CUDA cannot run it.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest
import torch

from dynask.kv.gpu.block_copy import MAX_RUNS_AS_SLICES
from dynask.kv.transfer import TransferId
from tests.kv.test_block_transports import KINDS, transport

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = (16, 8, 128)  # block_size, kv_heads, head_dim: Llama-3.1-8B's


def cuda_caches(num_blocks: int, seed: int | None) -> list[torch.Tensor]:
    """Four bf16 cache tensors on cuda:0, random (``seed``, drawn on the CPU) or -1."""
    if seed is None:
        return [torch.full((num_blocks, *SHAPE), -1.0, dtype=torch.bfloat16, device="cuda")
                for _ in range(4)]  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn((num_blocks, *SHAPE), generator=generator).to(torch.bfloat16).cuda()
        for _ in range(4)
    ]


SENDER = textwrap.dedent(
    """
    import asyncio, json, sys
    from tests.kv.test_block_transports import transport
    from tests.kv.test_transfer_ipc_cuda import cuda_caches

    async def main():
        sender = transport(sys.argv[3])
        source = cuda_caches(512, seed=3)
        for transfer_id, ids in json.loads(sys.argv[2]).items():
            assert await sender.send_blocks(sys.argv[1], transfer_id, source, ids)
        await sender.close()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_process_copies_cuda_blocks_into_the_reserved_ones(kind: str) -> None:
    import json

    contiguous_src, contiguous_dst = list(range(0, 100)), list(range(300, 400))
    fragmented_src = list(range(0, 2 * (MAX_RUNS_AS_SLICES + 10), 2))
    fragmented_dst = list(range(100, 100 + len(fragmented_src)))[::-1]
    plan = {"contiguous": contiguous_src, "fragmented": fragmented_src}

    async def main() -> list[torch.Tensor]:
        receiver = transport(kind)
        mine = cuda_caches(512, seed=None)
        receiver.share(mine)
        address = await receiver.listen("127.0.0.1")
        futures = [
            receiver.expect_blocks(TransferId("contiguous"), contiguous_dst),
            receiver.expect_blocks(TransferId("fragmented"), fragmented_dst),
        ]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER, address, json.dumps(plan), kind
        )
        assert await process.wait() == 0
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        await receiver.close()
        return mine

    received = asyncio.run(main())
    source = cuda_caches(512, seed=3)
    written = set(contiguous_dst) | set(fragmented_dst)
    for mine, theirs in zip(received, source, strict=True):
        assert torch.equal(mine[contiguous_dst], theirs[contiguous_src])
        assert torch.equal(mine[fragmented_dst], theirs[fragmented_src])
        rest = [i for i in range(512) if i not in written]
        assert bool((mine[rest] == -1).all())
    print(f"{kind}: {len(written)} blocks x 4 tensors equal the source, the rest untouched")
