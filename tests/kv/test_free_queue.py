import pytest

from dynask.kv.block import Block, BlockId
from dynask.kv.free_queue import FreeBlockQueue


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
    assert repr(blocks[0]) == "Block(block_id=0, ref_cnt=0, block_hash=None, token_ids=None)"


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
