"""The approximate prefix index: routed prompts count as cached for a TTL."""

from __future__ import annotations

import pytest

from dynask.kv.approx_index import DEFAULT_TTL_S, ApproxIndex

P = [11, 12, 13, 14]  # local hashes of a four-block prompt


def test_a_routed_prompt_counts_as_cached_until_its_ttl() -> None:
    index = ApproxIndex(ttl_s=10)
    index.note_routed("w0", P, now=100.0)
    index.note_routed("w1", P[:2], now=100.0)

    assert index.find_matches(P, now=109.9) == {"w0": 4, "w1": 2}
    assert index.find_matches([11, 99], now=109.9) == {"w0": 1, "w1": 1}
    assert index.find_matches(P, now=110.0) == {}
    assert (index.num_nodes(), index.actors(now=110.0), index.num_blocks("w0")) == (0, [], 0)


def test_routing_again_refreshes_only_the_blocks_routed() -> None:
    index = ApproxIndex(ttl_s=10)
    index.note_routed("w0", P, now=0.0)
    index.note_routed("w0", P[:2], now=5.0)  # a shorter prompt with the same prefix

    assert index.find_matches(P, now=12.0) == {"w0": 2}
    assert (index.num_blocks("w0", now=12.0), index.num_nodes()) == (2, 2)
    assert index.find_matches(P, now=15.0) == {}
    assert index.num_nodes() == 0


def test_refreshing_keeps_one_heap_entry_per_block() -> None:
    index = ApproxIndex(ttl_s=10)
    for second in range(100):
        index.note_routed("w0", P, now=float(second))

    assert len(index._expiries) == len(P)
    assert index.find_matches(P, now=108.9) == {"w0": 4}
    assert index.find_matches(P, now=109.0) == {}


def test_the_injected_clock_is_used_without_now() -> None:
    clock = [50.0]
    index = ApproxIndex(clock=lambda: clock[0])
    index.note_routed("w0", P)

    clock[0] = 50.0 + DEFAULT_TTL_S - 1
    assert index.find_matches(P) == {"w0": 4}
    clock[0] = 50.0 + DEFAULT_TTL_S
    assert index.find_matches(P) == {}


def test_remove_actor_drops_its_blocks_and_prunes() -> None:
    index = ApproxIndex()
    index.note_routed("w0", P, now=0.0)
    index.note_routed("w1", P[:1], now=0.0)

    index.remove_actor("w0")
    index.remove_actor("never-seen")

    assert index.find_matches(P, now=1.0) == {"w1": 1}
    assert (index.num_nodes(), index.actors(now=1.0)) == (1, ["w1"])
    index.note_routed("w0", P, now=2.0)  # back again: stale heap entries are harmless
    assert index.find_matches(P, now=120.5) == {"w0": 4}
    assert index.find_matches(P, now=122.0) == {}


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan")])
def test_the_ttl_must_be_positive(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        ApproxIndex(ttl_s=ttl)


def test_actor_ids_must_be_non_empty_strings() -> None:
    with pytest.raises(ValueError, match="actor id has value ''"):
        ApproxIndex().note_routed("", P)
