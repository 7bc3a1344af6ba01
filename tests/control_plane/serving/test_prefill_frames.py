"""``"prefill"`` frames read off an actor's token stream by its ``ActorHandle``: the
progress of this control plane's requests and of its peers' goes to the right load, and a
frame that cannot be read changes nothing and ends nothing."""

from __future__ import annotations

import asyncio

from dynask.actors.runtime.token_stream import KIND_PREFILL, encode_frame
from tests.control_plane.routing.replica_script import unconnected_handle


def test_prefill_frames_count_down_own_and_peer_requests() -> None:
    handle = unconnected_handle("a0")  # 16-token blocks
    handle.load.admit("mine", prompt_tokens=1000)  # 63 blocks
    handle.peer_load.admit("theirs", prompt_tokens=320)  # 20 blocks
    frames = [
        {"mine": 488, "theirs": 64, "unknown": 5, "not-a-count": "x"},
        ["not", "a", "map"],  # logged and skipped
        {"mine": 16},
    ]

    async def read() -> None:
        reader = asyncio.StreamReader()
        for frame in frames:
            reader.feed_data(encode_frame(KIND_PREFILL, frame))
        reader.feed_eof()
        await handle._read(reader)

    asyncio.run(read())

    assert (handle.load.prefill_blocks, handle.peer_load.prefill_blocks) == (1, 4)
    assert handle.lost_reason == "stream_closed"  # the EOF, not a bad frame, ended it
