import pickle
from collections.abc import Sequence

import pytest

from dynask.kv.block_pool import Block, BlockPool, CachedBlock, NoFreeBlocksError
from dynask.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventLog, KVEventRecord
from dynask.kv.hashing import SequenceHash, block_hashes

BLOCK_SIZE = 2


def make_pool(num_blocks: int = 4, **kwargs) -> tuple[BlockPool, KVEventLog]:
    log = KVEventLog()
    return BlockPool(num_blocks, BLOCK_SIZE, event_log=log, **kwargs), log


def ids(blocks: Sequence[Block]) -> list[int]:
    return [block.block_id for block in blocks]


def free_ids(pool: BlockPool) -> list[int]:
    return ids(list(pool._free_queue))


def chunks(tokens: Sequence[int]) -> list[list[int]]:
    return [list(tokens[i : i + BLOCK_SIZE]) for i in range(0, len(tokens), BLOCK_SIZE)]


def seq_hashes(tokens: Sequence[int]) -> list[SequenceHash]:
    return [pair.sequence for pair in block_hashes(tokens, BLOCK_SIZE)]


def run_request(pool: BlockPool, tokens: Sequence[int]) -> list[Block]:
    """Allocate and cache one block per full chunk of `tokens`, like a finished prefill."""
    hashes = seq_hashes(tokens)
    blocks = pool.allocate(len(hashes))
    parents: list[SequenceHash | None] = [None, *hashes[:-1]]
    full = chunks(tokens)[: len(hashes)]
    for block, block_hash, parent, chunk in zip(blocks, hashes, parents, full, strict=True):
        pool.cache_block(block, block_hash, parent, chunk)
    return blocks


def lookup(pool: BlockPool, tokens: Sequence[int]) -> list[Block]:
    full = chunks(tokens)[: len(tokens) // BLOCK_SIZE]
    return pool.get_cached_blocks(seq_hashes(tokens), full)


A = [1, 2, 3, 4, 5, 6]  # three full blocks
A_HASHES = seq_hashes(A)


def test_initial_state():
    pool, log = make_pool()
    assert free_ids(pool) == [0, 1, 2, 3]
    assert (pool.num_blocks, pool.block_size) == (4, 2)
    assert (pool.num_free_blocks, pool.num_cached_blocks, pool.usage) == (4, 0, 0.0)
    assert log.drain() == []


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "field"), [(0, 2, "num_blocks"), (4, 0, "block_size")]
)
def test_constructor_validates(num_blocks, block_size, field):
    with pytest.raises(ValueError, match=f"{field} must be positive, got 0"):
        BlockPool(num_blocks, block_size)


def test_allocate_in_id_order():
    pool, _ = make_pool()
    assert ids(pool.allocate(3)) == [0, 1, 2]
    assert ids(pool.allocate(1)) == [3]
    assert pool.allocate(0) == []
    assert [block.ref_cnt for block in pool._blocks] == [1, 1, 1, 1]
    assert pool.num_free_blocks == 0


def test_allocate_negative_raises():
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="num_blocks must be >= 0, got -1"):
        pool.allocate(-1)


def test_no_free_blocks_leaves_state_unchanged():
    pool, log = make_pool()
    run_request(pool, A)
    log.drain()
    with pytest.raises(NoFreeBlocksError, match="cannot allocate 2 KV blocks: only 1 are free"):
        pool.allocate(2)
    assert free_ids(pool) == [3]
    assert (pool.num_free_blocks, pool.num_cached_blocks) == (1, 3)
    assert [block.ref_cnt for block in pool._blocks] == [1, 1, 1, 0]
    assert log.drain() == []


def test_no_free_blocks_error_survives_pickle():
    error = pickle.loads(pickle.dumps(NoFreeBlocksError(5, 2)))
    assert isinstance(error, NoFreeBlocksError)
    assert (error.requested, error.free, str(error)) == (
        5,
        2,
        "cannot allocate 5 KV blocks: only 2 are free",
    )


def test_usage_counts_referenced_blocks_only():
    pool, _ = make_pool()
    first = pool.allocate(1)
    assert pool.usage == 0.25
    rest = run_request(pool, A)
    assert pool.usage == 1.0
    pool.free_request_blocks(rest)  # cached but unreferenced: not in use
    assert (pool.usage, pool.num_cached_blocks) == (0.25, 3)
    pool.free(first)
    assert pool.usage == 0.0


def test_free_request_blocks_is_tail_first_so_tail_is_evicted_first():
    pool, log = make_pool()
    blocks = run_request(pool, A)
    assert ids(blocks) == [0, 1, 2]
    pool.free_request_blocks(blocks)
    assert free_ids(pool) == [3, 2, 1, 0]
    log.drain()
    assert ids(pool.allocate(1)) == [3]  # never cached: no event
    assert ids(pool.allocate(1)) == [2]
    assert ids(pool.allocate(1)) == [1]
    assert ids(pool.allocate(1)) == [0]
    assert log.drain() == [
        KVEventRecord(4, BlockRemoved((A_HASHES[2],))),
        KVEventRecord(5, BlockRemoved((A_HASHES[1],))),
        KVEventRecord(6, BlockRemoved((A_HASHES[0],))),
    ]
    assert pool.num_cached_blocks == 0


def test_free_keeps_given_order():
    pool, _ = make_pool()
    blocks = pool.allocate(3)
    pool.free(blocks)
    assert free_ids(pool) == [3, 0, 1, 2]


def test_prefix_hit_after_free():
    pool, log = make_pool()
    pool.free_request_blocks(run_request(pool, A))
    log.drain()
    hits = lookup(pool, [*A, 7])
    assert ids(hits) == [0, 1, 2]
    assert [block.ref_cnt for block in hits] == [0, 0, 0]  # lookup takes no reference
    pool.touch(hits)
    assert [block.ref_cnt for block in hits] == [1, 1, 1]
    assert free_ids(pool) == [3]
    assert log.drain() == []


def test_partial_prefix_hit_stops_at_first_miss():
    pool, _ = make_pool()
    pool.free_request_blocks(run_request(pool, A))
    assert ids(lookup(pool, [1, 2, 3, 4, 9, 9])) == [0, 1]
    assert ids(lookup(pool, [9, 9, 3, 4, 5, 6])) == []


def test_lookup_stops_at_first_miss_even_if_later_hash_cached():
    pool, _ = make_pool()
    pool.free_request_blocks(run_request(pool, A))
    missing = SequenceHash(12345)
    hits = pool.get_cached_blocks([A_HASHES[0], missing, A_HASHES[2]], chunks(A))
    assert ids(hits) == [0]


def test_hash_collision_with_different_tokens_is_a_miss():
    pool, _ = make_pool()
    block = pool.allocate(1)[0]
    pool.cache_block(block, SequenceHash(42), None, [1, 2])
    assert pool.get_cached_blocks([SequenceHash(42)], [[9, 9]]) == []
    assert ids(pool.get_cached_blocks([SequenceHash(42)], [[1, 2]])) == [0]


def test_get_cached_blocks_length_mismatch_raises():
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="hashes has 2 entries but token_chunks has 1"):
        pool.get_cached_blocks(A_HASHES[:2], [[1, 2]])


def test_shared_block_returns_to_queue_only_at_zero_refs():
    pool, _ = make_pool()
    blocks = run_request(pool, A)
    hits = lookup(pool, A)
    pool.touch(hits)  # second request shares all three
    assert [block.ref_cnt for block in blocks] == [2, 2, 2]
    pool.free_request_blocks(blocks)
    assert free_ids(pool) == [3]
    pool.free_request_blocks(hits)
    assert free_ids(pool) == [3, 2, 1, 0]


def test_double_free_raises():
    pool, _ = make_pool()
    block = pool.allocate(1)[0]
    pool.free([block])
    with pytest.raises(ValueError, match="double free of block 0: freed 1 time"):
        pool.free([block])
    assert free_ids(pool) == [1, 2, 3, 0]


def test_double_free_in_one_call_changes_nothing():
    pool, _ = make_pool()
    a, b = pool.allocate(2)
    with pytest.raises(ValueError, match="double free of block 1: freed 2 time"):
        pool.free([a, b, b])
    assert (a.ref_cnt, b.ref_cnt) == (1, 1)
    assert free_ids(pool) == [2, 3]


def test_exact_event_sequence():
    pool, log = make_pool()
    blocks = run_request(pool, A)
    pool.free_request_blocks(blocks)
    pool.allocate(4)  # evicts 2, 1, 0 in one call
    pool.free(pool._blocks)
    assert pool.reset_prefix_cache()
    assert log.drain() == [
        KVEventRecord(1, BlockStored.from_token_ids((A_HASHES[0],), None, (1, 2), 2)),
        KVEventRecord(2, BlockStored.from_token_ids((A_HASHES[1],), A_HASHES[0], (3, 4), 2)),
        KVEventRecord(3, BlockStored.from_token_ids((A_HASHES[2],), A_HASHES[1], (5, 6), 2)),
        KVEventRecord(4, BlockRemoved((A_HASHES[2], A_HASHES[1], A_HASHES[0]))),
        KVEventRecord(5, AllBlocksCleared()),
    ]
    assert log.last_event_id == 5


def test_eviction_of_hash_zero_is_reported():
    # Regression guard: a hash of 0 is falsy but still a cached block.
    pool, log = make_pool(num_blocks=1)
    block = pool.allocate(1)[0]
    pool.cache_block(block, SequenceHash(0), None, [1, 2])
    pool.free([block])
    log.drain()
    pool.allocate(1)
    assert log.drain() == [KVEventRecord(2, BlockRemoved((SequenceHash(0),)))]


def test_cache_block_requires_full_block():
    pool, _ = make_pool()
    block = pool.allocate(1)[0]
    with pytest.raises(ValueError, match="token_ids has 1 tokens; only full blocks of 2"):
        pool.cache_block(block, SequenceHash(1), None, [1])


def test_cache_block_requires_referenced_block():
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="block 0 must be referenced to be cached"):
        pool.cache_block(pool._blocks[0], SequenceHash(1), None, [1, 2])


def test_cache_block_rejects_rehashing_a_cached_block():
    pool, _ = make_pool()
    block = pool.allocate(1)[0]
    pool.cache_block(block, SequenceHash(1), None, [1, 2])
    with pytest.raises(ValueError, match="block 0 is already cached as 1, not 2"):
        pool.cache_block(block, SequenceHash(2), None, [1, 2])


def test_cache_block_same_hash_again_is_a_no_op():
    pool, log = make_pool()
    block = pool.allocate(1)[0]
    assert pool.cache_block(block, SequenceHash(1), None, [1, 2])
    assert not pool.cache_block(block, SequenceHash(1), None, [1, 2])
    assert [record.event_id for record in log.drain()] == [1]


def test_duplicate_block_is_not_cached_and_frees_uncached():
    pool, log = make_pool()
    original, duplicate = pool.allocate(2)
    assert pool.cache_block(original, SequenceHash(7), None, [1, 2])
    assert not pool.cache_block(duplicate, SequenceHash(7), None, [1, 2])
    assert duplicate.block_hash is None
    assert pool.num_cached_blocks == 1
    pool.free([duplicate, original])
    assert free_ids(pool) == [2, 3, 1, 0]
    assert ids(pool.get_cached_blocks([SequenceHash(7)], [[1, 2]])) == [0]
    pool.allocate(3)  # pops 2, 3, 1: none cached
    assert log.drain() == [
        KVEventRecord(1, BlockStored.from_token_ids((SequenceHash(7),), None, (1, 2), 2))
    ]


def test_prefix_caching_disabled():
    pool, log = make_pool(enable_prefix_caching=False)
    blocks = run_request(pool, A)
    assert pool.num_cached_blocks == 0
    pool.free_request_blocks(blocks)
    assert lookup(pool, A) == []
    pool.allocate(4)
    assert log.drain() == []


def test_reset_refused_while_blocks_referenced():
    pool, log = make_pool()
    blocks = run_request(pool, A)
    log.drain()
    assert not pool.reset_prefix_cache()
    assert pool.cached_block_hashes() == A_HASHES
    assert log.drain() == []
    pool.free_request_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert (pool.num_cached_blocks, pool.cached_block_hashes()) == (0, [])
    assert [block.block_hash for block in blocks] == [None, None, None]
    assert lookup(pool, A) == []
    assert free_ids(pool) == [3, 2, 1, 0]
    assert log.drain() == [KVEventRecord(4, AllBlocksCleared())]


def test_cached_block_hashes_in_registration_order_minus_evicted():
    pool, _ = make_pool()
    pool.free_request_blocks(run_request(pool, A))
    assert pool.cached_block_hashes() == A_HASHES
    pool.allocate(2)  # block 3 (uncached), then block 2
    assert pool.cached_block_hashes() == A_HASHES[:2]


def test_cached_blocks_lists_hash_parent_and_tokens_until_evicted_or_reset():
    pool, _ = make_pool()
    blocks = run_request(pool, A)
    h0, h1, h2 = A_HASHES
    expected = [
        CachedBlock(h0, None, (1, 2)),
        CachedBlock(h1, h0, (3, 4)),
        CachedBlock(h2, h1, (5, 6)),
    ]
    assert pool.cached_blocks() == expected

    pool.free_request_blocks(blocks)
    pool.free(pool.allocate(2))  # the fresh block, then A's tail block (evicted)
    assert pool.cached_blocks() == expected[:2]
    assert pool.reset_prefix_cache()
    assert pool.cached_blocks() == []


# ---- cache_blocks: one event per run of blocks registered ---------------------------------

B = [1, 2, 3, 4, 9, 9]  # shares A's first two blocks, then differs
B_HASHES = seq_hashes(B)


def test_cache_blocks_emits_one_event_for_consecutive_blocks():
    pool, log = make_pool()
    blocks = pool.allocate(3)

    assert pool.cache_blocks(blocks, A_HASHES, None, chunks(A)) == 3

    assert log.drain() == [
        KVEventRecord(1, BlockStored.from_token_ids(tuple(A_HASHES), None, tuple(A), 2))
    ]
    assert ids(lookup(pool, A)) == [0, 1, 2]
    assert [b.parent_hash for b in pool.cached_blocks()] == [None, A_HASHES[0], A_HASHES[1]]


def test_cache_blocks_continues_a_parent_and_splits_at_duplicates():
    pool, log = make_pool(num_blocks=6)
    first = pool.allocate(2)
    pool.cache_blocks(first[1:], A_HASHES[1:2], A_HASHES[0], [[3, 4]])  # block 1 alone
    log.drain()
    blocks = pool.allocate(3)  # 2, 3, 4: the middle one duplicates block 1's hash

    registered = pool.cache_blocks(blocks, A_HASHES, None, chunks(A))

    assert registered == 2
    assert blocks[1].block_hash is None  # a duplicate stays uncached
    assert log.drain() == [
        KVEventRecord(2, BlockStored.from_token_ids((A_HASHES[0],), None, (1, 2), 2)),
        KVEventRecord(3, BlockStored.from_token_ids((A_HASHES[2],), A_HASHES[1], (5, 6), 2)),
    ]


def test_cache_blocks_checks_every_block_before_caching_any():
    pool, log = make_pool()
    blocks = pool.allocate(2)
    with pytest.raises(ValueError, match="token_ids has 1 tokens; only full blocks of 2"):
        pool.cache_blocks(blocks, A_HASHES[:2], None, [[1, 2], [3]])
    assert pool.num_cached_blocks == 0
    assert log.drain() == []


def test_cache_blocks_lengths_must_agree():
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="got 1 blocks, 2 hashes and 1 token chunks"):
        pool.cache_blocks(pool.allocate(1), A_HASHES[:2], None, [[1, 2]])


def test_num_cached_prefix_counts_leading_hashes_only():
    pool, _ = make_pool(num_blocks=6)
    run_request(pool, A)
    assert pool.num_cached_prefix(B_HASHES) == 2
    assert pool.num_cached_prefix(A_HASHES) == 3
    assert pool.num_cached_prefix([SequenceHash(12345), *A_HASHES]) == 0
    assert pool.num_cached_prefix([]) == 0


B = [11, 12, 13, 14]  # two full blocks, sharing nothing with A


def test_a_reused_prefix_outlasts_blocks_used_once():
    pool, log = make_pool(6, protected_share=0.5)
    pool.free_request_blocks(run_request(pool, A))  # blocks 0-2
    hits = lookup(pool, [*A, 7])
    pool.touch(hits)  # a second request takes A from the cache: reused
    pool.free_request_blocks(hits)
    pool.free_request_blocks(run_request(pool, B))  # 3, 4, then 5 evicts nothing cached
    # Probation (B's blocks, tail first, after the never-used 5), then protected (A's,
    # tail first; capacity 3 of 6).
    assert free_ids(pool) == [5, 4, 3, 2, 1, 0]
    log.drain()
    assert ids(pool.allocate(3)) == [5, 4, 3]  # B goes before A, though freed later
    assert log.drain() == [KVEventRecord(6, BlockRemoved(tuple(reversed(seq_hashes(B)))))]
    assert ids(lookup(pool, A)) == [0, 1, 2]


def test_plain_lru_evicts_the_least_recently_freed():
    pool, _ = make_pool(6, protected_share=0.0)
    pool.free_request_blocks(run_request(pool, A))
    hits = lookup(pool, [*A, 7])
    pool.touch(hits)
    pool.free_request_blocks(hits)
    pool.free_request_blocks(run_request(pool, B))
    assert free_ids(pool) == [5, 2, 1, 0, 4, 3]
    assert ids(pool.allocate(4)) == [5, 2, 1, 0]


def test_an_evicted_block_is_no_longer_reused():
    pool, _ = make_pool(3, protected_share=1.0)
    pool.free_request_blocks(run_request(pool, A))
    pool.touch(lookup(pool, A))
    pool.free_request_blocks(lookup(pool, A))
    blocks = pool.allocate(3)
    assert [block.reused for block in blocks] == [False, False, False]
    pool.free(blocks)
    assert free_ids(pool) == [2, 1, 0]
    assert pool._free_queue.num_protected == 0


def test_reset_requeues_every_block_unprotected():
    pool, _ = make_pool(4, protected_share=0.5)
    pool.free_request_blocks(run_request(pool, A))
    pool.touch(lookup(pool, A))
    pool.free_request_blocks(lookup(pool, A))
    assert pool.reset_prefix_cache()
    assert free_ids(pool) == [3, 2, 1, 0]
    assert not any(block.reused for block in pool._blocks)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_protected_share_is_validated(share):
    with pytest.raises(ValueError, match=f"protected_share must be in \\[0, 1\\], got {share}"):
        make_pool(protected_share=share)
