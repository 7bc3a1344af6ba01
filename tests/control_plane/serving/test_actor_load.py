"""``ActorLoad``: the blocks a control plane's requests hold on one actor."""

from __future__ import annotations

import pytest

from dynask.control_plane.serving.actor_load import ActorLoad


def terms(load: ActorLoad) -> tuple[int, int, int, int]:
    return (load.prefill_blocks, load.decode_blocks, load.waiting, len(load))


def test_a_request_prefills_its_uncached_blocks_then_decodes_all_of_its_blocks() -> None:
    load = ActorLoad(block_size=16)
    load.admit("r1", prompt_tokens=100, cached_tokens=64)  # 36 to compute: 3 blocks
    load.admit("r2", prompt_tokens=10)
    assert terms(load) == (3 + 1, 0, 2, 2)

    load.advance("r1", new_tokens=1)  # 101 tokens: 7 blocks
    assert terms(load) == (1, 7, 1, 2)
    load.advance("r1", new_tokens=11)  # 112 tokens: still 7 blocks
    load.advance("r1", new_tokens=1)  # 113: 8
    assert terms(load) == (1, 8, 1, 2)

    load.release("r1")
    load.release("r2")
    load.release("r2")  # idempotent: a response that never started releases too
    assert terms(load) == (0, 0, 0, 0)


def test_a_cached_prompt_still_counts_nothing_negative_and_ids_are_unique() -> None:
    load = ActorLoad(block_size=4)
    load.admit("r1", prompt_tokens=8, cached_tokens=12)
    assert terms(load) == (0, 0, 1, 1)
    with pytest.raises(ValueError, match="request 'r1' is already counted on this actor"):
        load.admit("r1", prompt_tokens=8)
    with pytest.raises(ValueError, match="ActorLoad block_size has value 0; expected an int >= 1"):
        ActorLoad(block_size=0)


def test_the_engines_prefill_progress_replaces_a_prefilling_requests_count() -> None:
    load = ActorLoad(block_size=16)
    load.admit("long", prompt_tokens=1000)  # 63 blocks to compute
    load.admit("hit", prompt_tokens=100, cached_tokens=96)  # 1 block expected
    assert terms(load) == (64, 0, 2, 2)

    load.progress("long", pending_tokens=488)  # a 512-token chunk done: 31 blocks left
    assert terms(load) == (32, 0, 2, 2)
    load.progress("hit", pending_tokens=100)  # its prefix was gone after all: 7 blocks
    assert terms(load) == (38, 0, 2, 2)
    load.progress("gone", pending_tokens=5)  # not counted here: nothing changes
    load.advance("long", new_tokens=1)  # decoding: 1001 tokens, 63 blocks
    load.progress("long", pending_tokens=0)  # a late report for a decoding one: ignored
    assert terms(load) == (7, 63, 1, 2)

    load.release("hit")
    load.release("long")
    assert terms(load) == (0, 0, 0, 0)
