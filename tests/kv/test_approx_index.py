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


def test_past_its_capacity_an_actor_forgets_its_least_recently_routed_blocks() -> None:
    index = ApproxIndex(ttl_s=100, capacity_blocks=5)
    index.note_routed("w0", [1, 2, 3], now=0.0)
    index.note_routed("w0", [7, 8], now=1.0)
    index.note_routed("w1", [1, 2, 3], now=1.0)  # another actor's budget is its own

    index.note_routed("w0", [9], now=2.0)  # 6 blocks: the oldest, prompt [1,2,3]'s tail, goes

    assert index.find_matches([1, 2, 3], now=3.0) == {"w0": 2, "w1": 3}
    assert index.find_matches([7, 8], now=3.0) == {"w0": 2}
    assert index.num_blocks("w0", now=3.0) == 5
    index.note_routed("w0", [20, 21, 22], now=4.0)  # 8 blocks: 3 more go, oldest first
    assert index.find_matches([1, 2, 3], now=5.0) == {"w1": 3}  # 2, then 1
    assert index.find_matches([7, 8], now=5.0) == {"w0": 1}  # 8 went, 7 stays
    assert index.num_blocks("w0", now=5.0) == 5


def test_routing_a_prefix_again_makes_it_most_recent() -> None:
    index = ApproxIndex(ttl_s=100, capacity_blocks=4)
    index.note_routed("w0", [1, 2], now=0.0)
    index.note_routed("w0", [5, 6], now=1.0)
    index.note_routed("w0", [1], now=2.0)  # block 1 is now the most recent, 2 the oldest

    index.note_routed("w0", [9], now=3.0)

    assert index.find_matches([1, 2], now=4.0) == {"w0": 1}
    assert index.find_matches([5, 6], now=4.0) == {"w0": 2}


def test_lru_and_ttl_together_leave_no_stale_heap_entry_behind() -> None:
    index = ApproxIndex(ttl_s=10, capacity_blocks=2)
    index.note_routed("w0", [1, 2], now=0.0)
    index.note_routed("w0", [3, 4], now=1.0)  # [1, 2] pruned by LRU
    index.note_routed("w0", [1, 2], now=2.0)  # back, [3, 4] pruned

    assert index.find_matches([1, 2], now=11.9) == {"w0": 2}
    assert index.find_matches([3, 4], now=11.9) == {}
    assert index.find_matches([1, 2], now=12.0) == {}
    assert (index.num_nodes(), index.actors(now=12.0)) == (0, [])


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_the_capacity_must_be_a_positive_int(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity_blocks has value"):
        ApproxIndex(capacity_blocks=capacity)  # type: ignore[arg-type]


def test_a_clock_that_goes_back_still_expires_in_expiry_order() -> None:
    index = ApproxIndex(ttl_s=10)
    index.note_routed("w0", P, now=50.0)  # expires at 60
    index.note_routed("w1", P[:2], now=20.0)  # earlier (a test's clock): expires at 30

    assert index.find_matches(P, now=29.9) == {"w0": 4, "w1": 2}
    assert index.find_matches(P, now=30.0) == {"w0": 4}
    assert index.find_matches(P, now=60.0) == {}
    assert (index.num_nodes(), len(index._expiries)) == (0, 0)


def test_the_heap_stays_ordered_over_many_routings_and_expiries() -> None:
    index = ApproxIndex(ttl_s=3)
    for second in range(20):  # prompts sharing 0..k, the rest their own
        index.note_routed(f"w{second % 3}", [0, 1, 2, 100 + second], now=float(second))

    assert index.find_matches([0, 1, 2, 119], now=19.5) == {"w0": 3, "w1": 4, "w2": 3}
    assert index.find_matches([0, 1, 2, 117], now=20.0) == {"w0": 3, "w1": 3}  # 117's expired
    assert index.find_matches([0], now=21.0) == {"w1": 1}
    assert index.find_matches([0], now=22.0) == {}
    assert (index.num_nodes(), len(index._expiries)) == (0, 0)


def test_forget_drops_a_block_and_everything_routed_below_it_for_one_actor() -> None:
    index = ApproxIndex(ttl_s=10)
    index.note_routed("w0", P, now=0.0)
    index.note_routed("w0", [11, 12, 77], now=0.0)  # a sibling branch below block 2
    index.note_routed("w1", P, now=0.0)

    index.forget("w0", P[:2])  # block 2 evicted: 12, 13, 14 and 77 go for w0

    assert index.find_matches(P, now=1.0) == {"w0": 1, "w1": 4}
    assert index.find_matches([11, 12, 77], now=1.0) == {"w0": 1, "w1": 2}
    assert (index.num_blocks("w0", now=1.0), index.num_blocks("w1", now=1.0)) == (1, 4)
    assert index.num_nodes() == 4  # 11, 12, 13, 14 (w1 holds them); 77 pruned
    # Routing a shorter prefix again does not bring the forgotten tail back.
    index.note_routed("w0", P[:3], now=2.0)
    assert index.find_matches(P, now=3.0) == {"w0": 3, "w1": 4}
    # Their expiries still come due without tripping over the forgotten nodes.
    assert index.find_matches(P, now=10.5) == {"w0": 3}
    assert index.find_matches(P, now=12.0) == {}
    assert (index.num_nodes(), index.actors(now=12.0)) == (0, [])


def test_forget_of_what_an_actor_never_held_is_a_no_op_and_an_empty_path_forgets_all() -> None:
    index = ApproxIndex(ttl_s=10)
    index.note_routed("w0", P, now=0.0)
    index.note_routed("w1", P[:2], now=0.0)

    index.forget("w1", P[:3])  # w1 never held block 3
    index.forget("w2", P[:1])  # unknown actor
    index.forget("w0", [99])  # unknown path
    assert index.find_matches(P, now=1.0) == {"w0": 4, "w1": 2}

    index.forget("w0", [])
    assert index.find_matches(P, now=1.0) == {"w1": 2}
    assert (index.actors(now=1.0), index.num_nodes()) == (["w1"], 2)


@pytest.mark.parametrize(
    ("share", "kept"),
    [(0.0, {"[1]": 0, "[5,6]": 1, "[7]": 1}), (0.5, {"[1]": 1, "[5,6]": 0, "[7]": 1})],
)
def test_an_actor_cache_evicts_as_its_engine_does_plain_or_segmented_lru(
    share: float, kept: dict[str, int]
) -> None:
    index = ApproxIndex(ttl_s=100)
    index.set_actor_cache("w0", 4, protected_share=share)
    index.note_routed("w0", [1, 2], now=0.0)
    index.note_routed("w0", [1], now=1.0)  # block 1 reused: protected when share > 0
    index.note_routed("w0", [5, 6], now=2.0)
    index.note_routed("w0", [7], now=3.0)  # 5 blocks: 2 goes either way
    assert index.find_matches([1, 2], now=3.5) == {"w0": 1}

    index.note_routed("w0", [8, 9], now=4.0)  # 6 blocks: two more go

    # LRU forgets 1 then 6 (its least recent); segmented forgets probation's 6 and 5.
    assert index.find_matches([1], now=5.0).get("w0", 0) == kept["[1]"]
    assert index.find_matches([5, 6], now=5.0).get("w0", 0) == kept["[5,6]"]
    assert index.find_matches([7], now=5.0).get("w0", 0) == kept["[7]"]
    assert index.find_matches([8, 9], now=5.0) == {"w0": 2}
    assert index.num_blocks("w0", now=5.0) == 4


def test_past_the_protected_share_the_least_recently_reused_block_is_demoted() -> None:
    index = ApproxIndex(ttl_s=100)
    index.set_actor_cache("w0", 4, protected_share=0.25)  # one protected block
    index.note_routed("w0", [1], now=0.0)
    index.note_routed("w0", [1], now=1.0)  # 1 protected
    index.note_routed("w0", [3], now=2.0)
    index.note_routed("w0", [3], now=3.0)  # 3 protected, 1 demoted to probation's tail

    index.note_routed("w0", [4, 5, 6], now=4.0)  # 5 blocks: probation's head (1) goes

    assert index.find_matches([1], now=5.0) == {}
    assert index.find_matches([3], now=5.0) == {"w0": 1}
    assert index.find_matches([4, 5, 6], now=5.0) == {"w0": 3}


def test_an_actor_cache_overrides_the_index_capacity_and_applies_at_once() -> None:
    index = ApproxIndex(ttl_s=100, capacity_blocks=3)
    index.note_routed("w0", [1, 2, 3], now=0.0)
    index.note_routed("w1", [1, 2, 3], now=0.0)

    index.set_actor_cache("w0", 2)  # smaller: its tail goes now
    index.set_actor_cache("w1", 5)
    index.note_routed("w1", [7, 8], now=1.0)  # 5 blocks fit w1's own capacity

    assert index.find_matches([1, 2, 3], now=2.0) == {"w0": 2, "w1": 3}
    assert (index.num_blocks("w0", now=2.0), index.num_blocks("w1", now=2.0)) == (2, 5)
    index.set_actor_cache("w1", None)  # back to the index's 3
    assert index.num_blocks("w1", now=2.0) == 3


@pytest.mark.parametrize("share", [-0.1, 1.5, True])
def test_the_protected_share_must_be_within_zero_and_one(share: object) -> None:
    with pytest.raises(ValueError, match="protected_share has value"):
        ApproxIndex().set_actor_cache("w0", 4, protected_share=share)  # type: ignore[arg-type]
