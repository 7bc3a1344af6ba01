"""bench/routing/eviction_bound: the hits of LRU, segmented LRU and Belady on hand-made
traces, each worked out by hand."""

from __future__ import annotations

from bench.routing.eviction_bound import belady_hits, lru_hits, reuse_of, segmented_hits
from bench.routing.trace import TraceRequest


def _trace(*prompts: tuple[int, ...]) -> list[TraceRequest]:
    return [TraceRequest(float(i), 512 * len(ids), 1, ids) for i, ids in enumerate(prompts)]


# A hot prefix (1, 2) served twice, then two one-off prompts, then the hot prefix again:
# 9 blocks pass through a cache of 4.
SCAN = _trace((1, 2), (1, 2), (3, 4), (5, 6), (1, 2))


def test_plain_lru_loses_the_hot_prefix_to_the_one_off_prompts() -> None:
    # Measured: all 10 blocks; hits: the second (1, 2) only.
    assert lru_hits(SCAN, warm=0, capacity=4) == 2 / 10


def test_segmented_lru_keeps_the_prefix_that_was_hit() -> None:
    # (1, 2) is protected after its hit; 3-6 evict each other in probation.
    assert segmented_hits(SCAN, warm=0, capacity=4, protected_share=0.5) == 4 / 10
    assert segmented_hits(SCAN, warm=0, capacity=4, protected_share=0.0) == 2 / 10


def test_belady_keeps_what_is_used_next() -> None:
    assert belady_hits(SCAN, warm=0, capacity=4) == 4 / 10
    # With room for one block only, the prefix's head is kept over its tail.
    assert belady_hits(_trace((1, 2), (1, 2)), warm=0, capacity=1) == 1 / 4


def test_warm_requests_fill_the_cache_but_are_not_measured() -> None:
    assert lru_hits(SCAN, warm=2, capacity=4) == 0.0  # the 3 measured: 6 blocks, no hit
    assert belady_hits(SCAN, warm=4, capacity=4) == 1.0  # (1, 2) kept through the scan


def test_reuse_is_split_by_what_the_block_was() -> None:
    trace = _trace((1, 2), (1, 2, 3), (4,), (1, 2, 3))
    # (1, 2): new without a hit, both touched again; (1, 2) hit in request 1 and again
    # in request 3; 3 new after a hit and touched again; 4 never again; request 3's
    # blocks all hit before and not touched again.
    assert reuse_of(trace) == {"hit_before": 2 / 5, "new_no_hit": 2 / 3, "new_after_hit": 1.0}
