import pytest

from dynask.kv.block import Block, BlockId
from dynask.kv.free_queue import FreeBlockQueue, SegmentedFreeQueue


def make_blocks(n: int) -> list[Block]:
    return [Block(BlockId(i)) for i in range(n)]


def ids(queue: FreeBlockQueue) -> list[int]:
    return [block.block_id for block in queue]


def test_starts_in_given_order():
    queue = FreeBlockQueue(make_blocks(4))
    assert ids(queue) == [0, 1, 2, 3]
    assert len(queue) == 4


def test_popleft_takes_head():
    blocks = make_blocks(3)
    queue = FreeBlockQueue(blocks)
    assert queue.popleft() is blocks[0]
    assert ids(queue) == [1, 2]
    assert blocks[0].prev_free is None and blocks[0].next_free is None


def test_popleft_empty_raises():
    with pytest.raises(IndexError, match="empty FreeBlockQueue"):
        FreeBlockQueue().popleft()


@pytest.mark.parametrize(("index", "left"), [(0, [1, 2]), (1, [0, 2]), (2, [0, 1])])
def test_remove_head_middle_tail(index, left):
    blocks = make_blocks(3)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[index])
    assert ids(queue) == left
    assert len(queue) == 2
    assert blocks[index] not in queue


def test_remove_only_block_empties_queue():
    blocks = make_blocks(1)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[0])
    assert ids(queue) == []
    queue.append(blocks[0])
    assert ids(queue) == [0]


def test_append_goes_to_tail():
    blocks = make_blocks(3)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[0])
    queue.append(blocks[0])
    assert ids(queue) == [1, 2, 0]


def test_remove_absent_block_raises():
    blocks = make_blocks(2)
    queue = FreeBlockQueue(blocks[:1])
    with pytest.raises(ValueError, match="block 1 is not in the free queue"):
        queue.remove(blocks[1])


@pytest.mark.parametrize("index", [0, 1])
def test_append_present_block_raises(index):
    blocks = make_blocks(2)
    queue = FreeBlockQueue(blocks)
    with pytest.raises(ValueError, match=f"block {index} is already in the free queue"):
        queue.append(blocks[index])
    assert ids(queue) == [0, 1]


def test_block_repr_omits_links():
    blocks = make_blocks(2)
    FreeBlockQueue(blocks)
    assert repr(blocks[0]) == (
        "Block(block_id=0, ref_cnt=0, block_hash=None, token_ids=None, reused=False)"
    )


def test_block_validates_fields():
    with pytest.raises(ValueError, match="block_id must be >= 0, got -1"):
        Block(BlockId(-1))
    with pytest.raises(ValueError, match="ref_cnt must be >= 0, got -2"):
        Block(BlockId(0), ref_cnt=-2)


@pytest.mark.parametrize(("count", "left"), [(0, [0, 1, 2, 3]), (2, [2, 3]), (4, [])])
def test_popleft_many_takes_a_run_from_the_head(count, left):
    blocks = make_blocks(4)
    queue = FreeBlockQueue(blocks)
    taken = queue.popleft_many(count)
    assert taken == blocks[:count]
    assert ids(queue) == left and len(queue) == len(left)
    assert all(b.prev_free is None and b.next_free is None for b in taken)
    queue.append(blocks[0] if count else Block(BlockId(9)))  # the tail is still right
    assert ids(queue)[-1] == (0 if count else 9)
    if left:
        assert queue.popleft() is blocks[count]


def test_popleft_many_past_the_length_raises_and_changes_nothing():
    queue = FreeBlockQueue(make_blocks(2))
    with pytest.raises(IndexError, match="popleft_many"):
        queue.popleft_many(3)
    assert ids(queue) == [0, 1]


def segment_ids(queue: SegmentedFreeQueue) -> list[int]:
    return [block.block_id for block in queue]


def test_segmented_queue_evicts_probation_before_protected():
    blocks = make_blocks(5)
    queue = SegmentedFreeQueue(blocks[:3], protected_capacity=2)
    blocks[3].reused = blocks[4].reused = True
    queue.append(blocks[4])
    queue.append(blocks[3])
    assert segment_ids(queue) == [0, 1, 2, 4, 3]
    assert (len(queue), queue.num_protected) == (5, 2)
    assert [b.block_id for b in queue.popleft_many(4)] == [0, 1, 2, 4]
    assert segment_ids(queue) == [3]


def test_segmented_queue_demotes_the_least_recently_freed_protected_block():
    blocks = make_blocks(4)
    queue = SegmentedFreeQueue(blocks[:1], protected_capacity=2)
    for block in blocks[1:]:
        block.reused = True
        queue.append(block)
    # Block 1 was freed first of the protected ones: demoted to probation's tail.
    assert segment_ids(queue) == [0, 1, 2, 3]
    assert queue.num_protected == 2
    assert [b.reused for b in blocks] == [False, False, True, True]
    queue.remove(blocks[2])
    queue.remove(blocks[1])
    assert segment_ids(queue) == [0, 3]
    assert blocks[1] not in queue and blocks[3] in queue


def test_segmented_queue_of_capacity_zero_is_plain_lru():
    blocks = make_blocks(4)
    queue = SegmentedFreeQueue(blocks[:2], protected_capacity=0)
    blocks[3].reused = True
    queue.append(blocks[3])
    queue.append(blocks[2])
    assert segment_ids(queue) == [0, 1, 3, 2]
    assert queue.num_protected == 0 and not blocks[3].reused


def test_segmented_queue_refuses_bad_counts():
    queue = SegmentedFreeQueue(make_blocks(2), protected_capacity=1)
    with pytest.raises(IndexError, match=r"popleft_many\(3\) from a queue of 2 blocks"):
        queue.popleft_many(3)
    with pytest.raises(ValueError, match="protected_capacity must be >= 0, got -1"):
        SegmentedFreeQueue(protected_capacity=-1)
