"""Tier-tagged KV events travel from a real engine actor to the control plane's index."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.control_plane.routing_stack import cluster_with_actors, serving_stack, tokens

BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # tiny Llama: layers, k/v, tokens, kv heads, dim, f32
TIERED = {"num_kv_blocks": 8, "block_size": 16, "kv_host_gb": 32 * BLOCK_BYTES / 10**9}


def test_blocks_evicted_to_host_are_routed_as_host_hits(tiny_llama_folder: Path) -> None:
    async def scenario() -> None:
        async with (
            cluster_with_actors(tiny_llama_folder, 1, "torch", TIERED) as proxies,
            serving_stack(proxies) as stack,
        ):
            a, b = tokens(1, 6, extra=4), tokens(2, 6, extra=4)  # 100 tokens each
            await stack.complete(a)
            await stack.complete(b)  # 7 blocks on an 8-block device: a's go to host

            await stack.complete(a)

            [decision] = await stack.decisions()
            [candidate] = decision["candidates"]
            # a's first block stayed on the device (evicted last), 5 went to host memory.
            assert (candidate["overlap_blocks"], candidate["host_overlap_blocks"]) == (6, 5)
            assert candidate["disk_overlap_blocks"] == 0
            stats = await proxies[0].stats()
            assert stats["host_hit_tokens"] == 80 and stats["host_kv_capacity_blocks"] == 32

    asyncio.run(scenario())
