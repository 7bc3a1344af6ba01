"""Prefill progress on real actors: a mocker actor on a real Dask cluster prefills a
256-token prompt in four 64-token chunks of 300 ms each, and the control plane's count of
that actor's queued prefill (``ActorLoad``, what the router's candidates carry) goes down
chunk by chunk from the engine's ``"prefill"`` frames, instead of staying whole until the
first token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.control_plane.routing_stack import cluster_with_actors, serving_stack, tokens, until

CHUNKED = {
    "speedup_ratio": 1.0,
    "num_kv_blocks": 256,
    "max_num_batched_tokens": 64,
    "prefill_ms_base": 300.0,
}


@pytest.mark.slow  # ~15 s: a cluster, an engine, 1.2 s of prefill
def test_a_long_prefill_is_counted_down_chunk_by_chunk(smollm2_folder: Path) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(smollm2_folder, 1, engine_args=CHUNKED) as proxies,
            serving_stack(proxies) as stack,
        ):
            [handle] = stack.handles
            seen: list[int] = []
            request = asyncio.create_task(stack.complete(tokens(7, blocks=16), max_tokens=2))
            await until(lambda: handle.load.waiting == 1, "the request to be routed")
            while handle.load.waiting:
                if not seen or seen[-1] != handle.load.prefill_blocks:
                    seen.append(handle.load.prefill_blocks)
                await asyncio.sleep(0.005)
            completion = await request

            # 16 blocks to compute; 12, 8 and 4 left after each of the first three chunks.
            assert seen == [16, 12, 8, 4]
            assert completion.usage.prompt_tokens == 256
            assert (handle.load.prefill_blocks, handle.load.decode_blocks) == (0, 0)

    asyncio.run(main())
