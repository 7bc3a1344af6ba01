"""The KV cache block: one fixed-size slot of paged KV memory, as the pool tracks it.

It lives in its own module because both the free queue (which links blocks through
``prev_free`` / ``next_free``) and the block pool need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType

from dynask.kv.hashing import SequenceHash

BlockId = NewType("BlockId", int)
"""Index of a block in the engine's paged KV tensors."""


@dataclass(slots=True, eq=False)
class Block:
    """A KV block's bookkeeping.

    ``ref_cnt`` counts the requests using the block; at 0 it sits in the free queue.
    ``block_hash`` and ``token_ids`` are set while the block is registered in the prefix
    cache. ``reused`` is set when a request took the block from the prefix cache (a hit)
    and cleared when it is evicted or demoted: the free queue keeps reused blocks in its
    protected segment (``kv.free_queue.SegmentedFreeQueue``). Blocks compare by identity
    (``eq=False``): two blocks are never interchangeable.
    """

    block_id: BlockId
    ref_cnt: int = 0
    block_hash: SequenceHash | None = None
    token_ids: tuple[int, ...] | None = None
    reused: bool = False
    # Intrusive free-list links, owned by FreeBlockQueue. Left out of repr: they would
    # print the whole queue (and recurse).
    prev_free: Block | None = field(default=None, repr=False)
    next_free: Block | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.block_id < 0:
            raise ValueError(f"Block.block_id must be >= 0, got {self.block_id!r}")
        if self.ref_cnt < 0:
            raise ValueError(f"Block.ref_cnt must be >= 0, got {self.ref_cnt!r}")

    def forget_hash(self) -> None:
        """Drop the prefix-cache identity (on eviction or cache reset)."""
        self.block_hash = None
        self.token_ids = None


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, for non-negative ``a`` and positive ``b`` (blocks for tokens)."""
    return -(-a // b)
