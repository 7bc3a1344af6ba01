"""The global prefix index: events, gaps and resync, pruning, and a brute-force reference."""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynask.kv.block_pool import BlockPool
from dynask.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventLog,
    KVEventRecord,
)
from dynask.kv.hashing import (
    DEFAULT_SEED,
    LocalBlockHash,
    SequenceHash,
    chain_hash,
    hash_seed,
    local_block_hash,
)
from dynask.kv.prefix_index import ApplyStatus, KVCacheDump, PrefixIndex
from dynask.kv.tier import KVTier

BS = 2  # tokens per block


def locals_of(tokens: Sequence[int], seed: int = DEFAULT_SEED) -> list[int]:
    return [local_block_hash(tokens[i : i + BS], seed) for i in range(0, len(tokens), BS)]


def stored(
    tokens: Sequence[int], parent: SequenceHash | None = None, seed: int = DEFAULT_SEED
) -> BlockStored:
    """A BlockStored for the full blocks of ``tokens`` after ``parent``, hashed with ``seed``."""
    hashes, chained = [], parent
    for local in locals_of(tokens, seed):
        chained = chain_hash(chained, LocalBlockHash(local), seed)
        hashes.append(chained)
    return BlockStored.from_token_ids(tuple(hashes), parent, tuple(tokens), BS)


class Feeder:
    """Feeds one index, numbering each actor's events 1, 2, 3, ..."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self.next_id: dict[str, int] = {}

    def send(self, actor: str, event: KVEvent) -> ApplyStatus:
        event_id = self.next_id.get(actor, 1)
        self.next_id[actor] = event_id + 1
        return self.index.apply(actor, KVEventRecord(event_id, event)).status


A = [1, 2, 3, 4, 5, 6]  # three blocks
A_STORED = stored(A)


def test_a_stored_chain_matches_its_prefixes() -> None:
    index = PrefixIndex()
    assert Feeder(index).send("w0", A_STORED) is ApplyStatus.APPLIED

    assert index.find_matches(locals_of(A)) == {"w0": 3}
    assert index.find_matches(locals_of([1, 2, 3, 4, 9, 9])) == {"w0": 2}
    assert index.find_matches(locals_of([1, 2])) == {"w0": 1}
    assert index.find_matches(locals_of([3, 4, 5, 6])) == {}
    assert index.find_matches([]) == {}
    assert (index.num_blocks("w0"), index.num_blocks("nobody"), index.actors()) == (3, 0, ["w0"])


def test_a_child_event_extends_the_chain_through_its_parent_hash() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    feed.send("w0", stored([1, 2]))
    feed.send("w0", stored([3, 4], parent=stored([1, 2]).block_hashes[-1]))

    assert index.find_matches(locals_of([1, 2, 3, 4])) == {"w0": 2}


def test_actors_drop_out_at_the_first_block_they_lack() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    feed.send("w0", A_STORED)
    feed.send("w1", stored([1, 2, 3, 4]))
    feed.send("w2", A_STORED)
    feed.send("w2", BlockRemoved((A_STORED.block_hashes[1],)))  # middle block evicted

    # w2 still holds block 3, but not contiguously from the root.
    assert index.find_matches(locals_of(A)) == {"w0": 3, "w1": 2, "w2": 1}
    assert index.num_blocks("w2") == 2


def test_a_stored_block_whose_parent_the_actor_lacks_is_dropped() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    status = feed.send("w0", stored([3, 4], parent=SequenceHash(12345)))

    assert status is ApplyStatus.APPLIED  # consumed: the id advanced
    assert (index.num_blocks("w0"), index.num_nodes(), index.expected_event_id("w0")) == (0, 0, 2)


def test_removing_an_unknown_hash_is_ignored_and_cleared_touches_one_actor() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    feed.send("w0", A_STORED)
    feed.send("w1", A_STORED)
    feed.send("w0", BlockRemoved((SequenceHash(999),)))
    feed.send("w0", AllBlocksCleared())

    assert index.find_matches(locals_of(A)) == {"w1": 3}
    assert (index.num_blocks("w0"), index.num_nodes()) == (0, 3)


def test_the_same_tokens_under_two_engine_seeds_share_a_node() -> None:
    # Two sequence hashes of the same tokens (e.g. a LoRA request's and a base one's) land
    # on one node; removing one must not hide the other.
    index = PrefixIndex()
    feed = Feeder(index)
    base, lora = stored([1, 2]), stored([1, 2], seed=hash_seed(["lora"]))
    feed.send("w0", base)
    feed.send("w0", lora)
    assert (index.num_blocks("w0"), index.num_nodes()) == (2, 1)

    feed.send("w0", BlockRemoved(base.block_hashes))
    assert index.find_matches(locals_of([1, 2])) == {"w0": 1}
    feed.send("w0", BlockRemoved(lora.block_hashes))
    assert (index.find_matches(locals_of([1, 2])), index.num_nodes()) == ({}, 0)


def test_the_index_seed_keys_the_tree() -> None:
    seed = hash_seed(["adapter-a"])
    index = PrefixIndex(seed=seed)
    Feeder(index).send("w0", A_STORED)

    assert index.find_matches(locals_of(A, seed)) == {"w0": 3}
    assert index.find_matches(locals_of(A)) == {}


def test_a_gap_flags_a_resync_and_applies_nothing_until_then() -> None:
    index = PrefixIndex()
    index.apply("w0", KVEventRecord(1, stored([1, 2])))
    gap = index.apply("w0", KVEventRecord(3, A_STORED))  # id 2 was lost

    assert (gap.status, gap.resync_needed, gap.expected_event_id) == (ApplyStatus.GAP, True, 2)
    assert index.needs_resync("w0")
    assert index.find_matches(locals_of(A)) == {"w0": 1}
    assert index.apply("w0", KVEventRecord(4, AllBlocksCleared())).status is ApplyStatus.GAP
    assert index.find_matches(locals_of(A)) == {"w0": 1}


def test_an_old_or_repeated_id_is_ignored() -> None:
    index = PrefixIndex()
    index.apply("w0", KVEventRecord(1, A_STORED))
    again = index.apply("w0", KVEventRecord(1, AllBlocksCleared()))

    assert (again.status, again.resync_needed) == (ApplyStatus.DUPLICATE, False)
    assert (index.num_blocks("w0"), index.expected_event_id("w0")) == (3, 2)


def test_a_first_event_after_1_means_the_index_missed_the_start() -> None:
    index = PrefixIndex()

    assert index.apply("w0", KVEventRecord(5, A_STORED)).status is ApplyStatus.GAP
    assert index.needs_resync("w0") and index.num_blocks("w0") == 0


def test_resync_replaces_the_actor_blocks_and_the_expected_id() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    feed.send("w0", stored([7, 7, 8, 8]))
    feed.send("w1", stored([7, 7]))
    index.apply("w0", KVEventRecord(9, AllBlocksCleared()))  # gap

    index.resync("w0", KVCacheDump(last_event_id=10, stored=(A_STORED,)))

    assert not index.needs_resync("w0")
    assert index.find_matches(locals_of([7, 7, 8, 8])) == {"w1": 1}
    assert index.find_matches(locals_of(A)) == {"w0": 3}
    assert index.apply("w0", KVEventRecord(10, AllBlocksCleared())).status is ApplyStatus.DUPLICATE
    assert index.apply("w0", KVEventRecord(11, AllBlocksCleared())).status is ApplyStatus.APPLIED
    assert index.num_blocks("w0") == 0


def test_remove_actor_prunes_every_node_only_it_held() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    feed.send("w0", A_STORED)
    feed.send("w0", stored([9, 9, 9, 9]))
    feed.send("w1", stored([1, 2, 3, 4]))
    feed.send("w1", BlockRemoved((stored([1, 2]).block_hashes[0],)))  # w1 keeps only block 2
    assert index.num_nodes() == 5

    index.remove_actor("w0")
    # Block 1 stays, empty, as the parent of w1's block 2.
    assert (index.num_nodes(), index.actors()) == (2, ["w1"])
    index.remove_actor("w1")
    index.remove_actor("never-seen")
    assert (index.num_nodes(), index.actors(), index.expected_event_id("w0")) == (0, [], 1)


def test_actor_ids_must_be_non_empty_strings() -> None:
    with pytest.raises(ValueError, match="actor id has value ''; expected a non-empty string"):
        PrefixIndex().apply("", KVEventRecord(1, A_STORED))


# ---- the dump ----------------------------------------------------------------------------


def test_a_dump_survives_json_and_msgpack() -> None:
    dump = KVCacheDump(last_event_id=4, stored=(A_STORED, stored([3, 3], A_STORED.block_hashes[0])))

    assert KVCacheDump.from_dict(json.loads(json.dumps(dump.to_dict(packed=False)))) == dump
    assert KVCacheDump.from_dict(msgpack.unpackb(msgpack.packb(dump.to_dict()))) == dump


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stored": []}, "'last_event_id' has value None; expected an int"),
        ({"last_event_id": True, "stored": []}, "'last_event_id' has value True"),
        ({"last_event_id": 0}, "'stored' has value None; expected a list"),
        ({"last_event_id": 0, "stored": [{"type": "cleared"}]}, r"'stored\[0\]' has value"),
        ({"last_event_id": 0, "stored": [7]}, r"'stored\[0\]' has value 7"),
        ({"last_event_id": -1, "stored": []}, "last_event_id must be >= 0, got -1"),
    ],
)
def test_a_malformed_dump_is_a_clear_value_error(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVCacheDump.from_dict(data)


def run_prompt(pool: BlockPool, tokens: Sequence[int]) -> None:
    """Cache the prompt's full blocks like a finished prefill, then free them."""
    entries = stored(tokens)
    hits = pool.get_cached_blocks(
        entries.block_hashes, [tokens[i : i + BS] for i in range(0, len(tokens), BS)]
    )
    pool.touch(hits)
    fresh = pool.allocate(len(entries.block_hashes) - len(hits))
    parents = (None, *entries.block_hashes[:-1])
    for position, block in enumerate(fresh, start=len(hits)):
        chunk = tokens[position * BS : (position + 1) * BS]
        pool.cache_block(block, entries.block_hashes[position], parents[position], chunk)
    pool.free_request_blocks([*hits, *fresh])


def cache_orphan(pool: BlockPool, tokens: Sequence[int], parent: SequenceHash) -> None:
    """Cache one block whose parent is not cached (a duplicate parent evicted meanwhile)."""
    block = pool.allocate(1)
    pool.cache_block(block[0], stored(tokens, parent).block_hashes[0], parent, tokens)
    pool.free(block)


def test_a_pool_dump_lists_parents_first_and_leaves_out_orphans() -> None:
    pool = BlockPool(8, BS)
    run_prompt(pool, [1, 2, 3, 4])
    run_prompt(pool, [5, 6])
    run_prompt(pool, [1, 2, 7, 8])  # a hit on [1, 2], then [7, 8] under it
    cache_orphan(pool, [9, 9], parent=SequenceHash(444))

    dump = KVCacheDump.from_block_pool(pool, last_event_id=7)

    h12, h56 = stored([1, 2]).block_hashes[0], stored([5, 6]).block_hashes[0]
    assert dump.last_event_id == 7
    assert [(e.parent_hash, e.token_ids, e.block_size) for e in dump.stored] == [
        (None, (1, 2), BS),
        (h12, (3, 4), BS),
        (h12, (7, 8), BS),
        (None, (5, 6), BS),
    ]
    assert [e.block_hashes for e in dump.stored] == [
        (h12,),
        stored([3, 4], h12).block_hashes,
        stored([7, 8], h12).block_hashes,
        (h56,),
    ]


def test_a_dump_puts_a_parent_cached_again_before_its_child() -> None:
    pool = BlockPool(4, BS)
    h12 = stored([1, 2]).block_hashes[0]
    cache_orphan(pool, [3, 4], parent=h12)
    run_prompt(pool, [1, 2])  # the parent comes back, after its child
    assert [c.token_ids for c in pool.cached_blocks()] == [(3, 4), (1, 2)]

    dump = KVCacheDump.from_block_pool(pool, last_event_id=0)

    assert [(e.parent_hash, e.token_ids) for e in dump.stored] == [(None, (1, 2)), (h12, (3, 4))]
    index = PrefixIndex()
    index.resync("w0", dump)
    assert index.find_matches(locals_of([1, 2, 3, 4])) == {"w0": 2}


def test_resync_from_a_pool_dump_matches_the_event_fed_index() -> None:
    log = KVEventLog()
    pool = BlockPool(6, BS, event_log=log)
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 7], [8, 8, 1, 2], [1, 2, 9, 9, 9, 9]]
    fed = PrefixIndex()
    for tokens in prompts:
        run_prompt(pool, tokens)
        for record in log.drain():
            assert fed.apply("w0", record).status is ApplyStatus.APPLIED
    resynced = PrefixIndex()
    resynced.resync("w0", KVCacheDump.from_block_pool(pool, log.last_event_id))

    for tokens in [*prompts, [1, 2, 3, 4], [8, 8], [9, 9]]:
        query = locals_of(tokens)
        assert resynced.find_matches(query) == fed.find_matches(query), tokens
    assert resynced.expected_event_id("w0") == fed.expected_event_id("w0")


# ---- against a brute-force reference -----------------------------------------------------


class Reference:
    """Each actor's blocks as sequence hash -> path of local hashes from the root."""

    def __init__(self) -> None:
        self.paths: dict[str, dict[int, tuple[int, ...]]] = {}

    def apply(self, actor: str, event: KVEvent, seed: int = DEFAULT_SEED) -> None:
        held = self.paths.setdefault(actor, {})
        if isinstance(event, AllBlocksCleared):
            held.clear()
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                held.pop(block_hash, None)
        else:
            prefix = () if event.parent_hash is None else held.get(event.parent_hash)
            if prefix is None:
                return
            locals_ = locals_of(event.token_ids, seed)  # the ints, hashed as before
            for block_hash, local in zip(event.block_hashes, locals_, strict=True):
                prefix = (*prefix, local)
                held[block_hash] = prefix

    def find_matches(self, query: Sequence[int]) -> dict[str, int]:
        matches = {}
        for actor, held in self.paths.items():
            paths, depth = set(held.values()), 0
            while depth < len(query) and tuple(query[: depth + 1]) in paths:
                depth += 1
            if depth:
                matches[actor] = depth
        return matches

    def num_nodes(self) -> int:
        paths = {path for held in self.paths.values() for path in held.values()}
        return len({path[:end] for path in paths for end in range(1, len(path) + 1)})


ACTORS = ["w0", "w1", "w2"]
block_tokens = st.lists(st.integers(0, 2), min_size=BS, max_size=BS)  # 9 distinct blocks
SEEDS = [DEFAULT_SEED, hash_seed(["lora"])]


def draw_event(data: st.DataObject, held: list[SequenceHash]) -> KVEvent:
    kind = data.draw(st.sampled_from(["stored", "stored", "stored", "removed", "cleared"]))
    if kind == "cleared":
        return AllBlocksCleared()
    if kind == "removed":
        pool = [*held, SequenceHash(424242)]
        return BlockRemoved(tuple(data.draw(st.lists(st.sampled_from(pool), min_size=1))))
    parents: list[SequenceHash | None] = [None, *held, SequenceHash(777)]
    parent = data.draw(st.sampled_from(parents))
    blocks = data.draw(st.lists(block_tokens, min_size=1, max_size=3))
    return stored([t for block in blocks for t in block], parent, data.draw(st.sampled_from(SEEDS)))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_index_agrees_with_a_brute_force_reference(data: st.DataObject) -> None:
    index, reference = PrefixIndex(), Reference()
    feed = Feeder(index)
    for _ in range(data.draw(st.integers(1, 25))):
        actor = data.draw(st.sampled_from(ACTORS))
        event = draw_event(data, [SequenceHash(h) for h in reference.paths.get(actor, {})])
        assert feed.send(actor, event) is ApplyStatus.APPLIED
        reference.apply(actor, event)

        blocks = data.draw(st.lists(block_tokens, max_size=4))
        query = locals_of([t for block in blocks for t in block])
        assert index.find_matches(query) == reference.find_matches(query)
        for held in reference.paths.values():
            for path in held.values():
                assert index.find_matches(path) == reference.find_matches(path)
        assert index.num_nodes() == reference.num_nodes()
        assert {a: index.num_blocks(a) for a in ACTORS} == {
            a: len(reference.paths.get(a, {})) for a in ACTORS
        }
    for actor in ACTORS:
        index.remove_actor(actor)
    assert index.num_nodes() == 0


def test_a_hash_stored_again_at_another_node_moves_there() -> None:
    index = PrefixIndex()
    feeder = Feeder(index)
    feeder.send("a", stored([1, 2, 3, 4]))
    h2 = stored([1, 2, 3, 4]).block_hashes[1]

    # The engine names new blocks with a hash it gave before (its h2 now sits first).
    feeder.send("a", BlockStored.from_token_ids((h2, SequenceHash(99)), None, (5, 6, 7, 8), BS))

    assert index.find_matches(locals_of([5, 6, 7, 8])) == {"a": 2}
    assert index.find_matches(locals_of([1, 2, 3, 4])) == {"a": 1}  # h2's old node is gone
    assert (index.num_blocks("a"), index.num_nodes()) == (3, 3)


def test_a_hash_moved_up_its_own_chain_leaves_the_chain_whole() -> None:
    index = PrefixIndex()
    feeder = Feeder(index)
    feeder.send("a", stored([1, 2, 3, 4]))
    h1, h2 = stored([1, 2, 3, 4]).block_hashes

    # The same tokens again, named (h2, 99): moving h2 to the first node prunes the
    # second one, which the second block then makes anew.
    feeder.send("a", BlockStored.from_token_ids((h2, SequenceHash(99)), None, (1, 2, 3, 4), BS))

    assert index.find_matches(locals_of([1, 2, 3, 4])) == {"a": 2}
    assert (index.num_blocks("a"), index.num_nodes()) == (3, 2)
    feeder.send("a", BlockRemoved((h1, h2)))
    assert index.find_matches(locals_of([1, 2, 3, 4])) == {}  # its first block is gone
    assert (index.num_blocks("a"), index.num_nodes()) == (1, 2)


# ---- issue 21: tokens packed on the wire, or listed (an older actor, JSON) ---------------


def over_the_wire(record: KVEventRecord, packed: bool) -> KVEventRecord:
    """``record`` as the token stream carries it (msgpack), packed or as lists, read back."""
    data = msgpack.unpackb(msgpack.packb(record.to_dict(packed=packed)), raw=False)
    return KVEventRecord.from_dict(data)


@pytest.mark.parametrize("seed", SEEDS)
def test_packed_and_listed_events_build_the_same_index(seed: int) -> None:
    log = KVEventLog()
    pool = BlockPool(6, BS, event_log=log)  # small: the later prompts evict the first
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 7], [8, 8, 1, 2], [1, 2, 9, 9, 9, 9]]
    packed, listed = PrefixIndex(seed), PrefixIndex(seed)
    kinds = []
    for tokens in prompts:
        run_prompt(pool, tokens)
        for record in log.drain():
            kinds.append(type(record.event).__name__)
            assert packed.apply("w0", over_the_wire(record, True)).status is ApplyStatus.APPLIED
            assert listed.apply("w0", over_the_wire(record, False)).status is ApplyStatus.APPLIED

    assert kinds == [*["BlockStored"] * 6, "BlockRemoved", "BlockStored", "BlockStored"]
    # The pool held 6 blocks: [9, 9] [9, 9] evicted the least recent leaves [5, 6], [7, 7].
    queries = [*prompts, [1, 2, 3, 4], [8, 8], [1, 2, 3, 4, 5, 6, 7, 7]]
    expected = [{"w0": 2}, {"w0": 2}, {"w0": 2}, {"w0": 3}, {"w0": 2}, {"w0": 1}, {"w0": 2}]
    assert [packed.find_matches(locals_of(q, seed)) for q in queries] == expected
    assert [listed.find_matches(locals_of(q, seed)) for q in queries] == expected
    assert (packed.num_blocks("w0"), packed.num_nodes()) == (6, 6)
    assert (listed.num_blocks("w0"), listed.num_nodes()) == (6, 6)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_packed_and_listed_events_agree_with_the_reference(data: st.DataObject) -> None:
    seed = data.draw(st.sampled_from(SEEDS))
    packed, listed, reference = PrefixIndex(seed), PrefixIndex(seed), Reference()
    next_id: dict[str, int] = {}
    for _ in range(data.draw(st.integers(1, 20))):
        actor = data.draw(st.sampled_from(ACTORS))
        event = draw_event(data, [SequenceHash(h) for h in reference.paths.get(actor, {})])
        record = KVEventRecord(next_id.setdefault(actor, 1), event)
        next_id[actor] += 1
        packed.apply(actor, over_the_wire(record, packed=True))
        listed.apply(actor, over_the_wire(record, packed=False))
        reference.apply(actor, event, seed)

        for held in reference.paths.values():
            for path in held.values():
                assert packed.find_matches(path) == listed.find_matches(path)
                assert packed.find_matches(path) == reference.find_matches(path)
        assert packed.num_nodes() == listed.num_nodes() == reference.num_nodes()


def test_on_evicted_hears_each_run_of_device_blocks_leaving_as_its_shallowest_path() -> None:
    heard: list[tuple[str, list[int]]] = []
    index = PrefixIndex(on_evicted=lambda actor, path: heard.append((actor, path)))
    feed = Feeder(index)
    chain = [1, 2, 3, 4, 5, 6, 7, 8]  # four blocks
    event = stored(chain)
    feed.send("w0", event)
    local = locals_of(chain)

    feed.send("w0", BlockRemoved(event.block_hashes[2:][::-1]))  # the tail, as engines evict
    assert heard == [("w0", local[:3])]
    assert index.find_matches(local) == {"w0": 2}

    heard.clear()
    feed.send("w0", BlockRemoved(event.block_hashes[:2], tier=KVTier.HOST))  # not device
    feed.send("w0", BlockRemoved((SequenceHash(12345),)))  # a block it never held
    assert heard == []
    feed.send("w0", AllBlocksCleared())
    assert heard == [("w0", [])]
