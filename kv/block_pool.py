"""The block pool: owns every KV block, the free queue and the prefix cache.

Design decisions:

- A block with ``ref_cnt == 0`` is free, but if it has a hash it *stays in the prefix
  cache* until it is popped for reuse. Freed-but-cached blocks are what make prefix hits
  across requests possible; eviction happens lazily, inside ``allocate``.
- Eviction is segmented LRU over the free queue (``kv.free_queue.SegmentedFreeQueue``):
  blocks no request has taken from the cache go first, least recently freed first, then
  the reused ones (at most ``protected_share`` of the pool; 0 is plain LRU). A request's
  blocks should be freed tail-first (``free_request_blocks``): the last blocks of a
  prompt are the least likely to be shared, so they are evicted before the prefix
  blocks other requests may hit.
- A prefix lookup re-checks the cached block's tokens, so a 64-bit hash collision is a
  miss rather than wrong KV.
- Only the first block to register a hash is cached; a later block with the same
  contents is a duplicate that simply returns to the free queue uncached.
- Every change to the cache is reported to the optional ``KVEventLog`` so the router can
  mirror it: one ``BlockStored`` per run of blocks a ``cache_blocks`` call registered
  (each block the parent of the next), one ``BlockRemoved`` per ``allocate`` call that
  evicted, ``AllBlocksCleared`` on reset.
- An optional eviction listener (``set_eviction_listener``) sees each evicted block's id
  and identity *before* the block is handed out again, while its KV is still intact: the
  offload tiers (``kv.offload``) copy it to host memory or disk there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dynask.kv.block import Block, BlockId
from dynask.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventLog
from dynask.kv.free_queue import SegmentedFreeQueue
from dynask.kv.hashing import SequenceHash, pack_token_ids
from dynask.kv.tier import KVTier

__all__ = [
    "DEFAULT_PROTECTED_SHARE",
    "Block",
    "BlockId",
    "BlockPool",
    "CachedBlock",
    "EvictionListener",
    "NoFreeBlocksError",
]


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """What the prefix cache knows of one block: its hash, its parent's, its tokens.

    ``tier`` says where it is held (the offload tiers keep these too).
    """

    block_hash: SequenceHash
    parent_hash: SequenceHash | None
    token_ids: tuple[int, ...]
    tier: KVTier = KVTier.DEVICE


DEFAULT_PROTECTED_SHARE = 0.5
"""The share of the pool the free queue's protected segment (reused blocks) may fill."""

EvictionListener = Callable[[list[BlockId], list[CachedBlock]], None]
"""Called with the ids and identities of blocks evicted by one ``allocate``, before reuse."""


class NoFreeBlocksError(RuntimeError):
    """Fewer free blocks than requested; the pool was left unchanged."""

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"cannot allocate {requested} KV blocks: only {free} are free")
        self.requested = requested
        self.free = free

    def __reduce__(self) -> tuple[type[NoFreeBlocksError], tuple[int, int]]:
        # Keeps the type and fields when the error crosses a process boundary (pickle).
        return (type(self), (self.requested, self.free))


class BlockPool:
    """Allocates, frees and prefix-caches a fixed set of KV blocks.

    Not thread-safe: one engine thread owns the pool (only the event log is shared).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        event_log: KVEventLog | None = None,
        protected_share: float = DEFAULT_PROTECTED_SHARE,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks!r}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size!r}")
        if not 0.0 <= protected_share <= 1.0:
            raise ValueError(f"protected_share must be in [0, 1], got {protected_share!r}")
        self._block_size = block_size
        self._enable_prefix_caching = enable_prefix_caching
        self._event_log = event_log
        self._blocks = [Block(BlockId(i)) for i in range(num_blocks)]
        self._protected_share = protected_share
        self._protected_capacity = int(num_blocks * protected_share)
        self._free_queue = SegmentedFreeQueue(self._blocks, self._protected_capacity)
        self._cached: dict[SequenceHash, Block] = {}
        self._parent_of: dict[SequenceHash, SequenceHash | None] = {}
        self._eviction_listener: EvictionListener | None = None

    def set_eviction_listener(self, listener: EvictionListener | None) -> None:
        """Call ``listener`` with the blocks each ``allocate`` evicts (None: stop)."""
        self._eviction_listener = listener

    @property
    def num_blocks(self) -> int:
        """Total number of blocks."""
        return len(self._blocks)

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def protected_share(self) -> float:
        """The share of the blocks that reused blocks may hold when freed (0: plain LRU)."""
        return self._protected_share

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no references, cached or not."""
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, referenced or not."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one request."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_blocks(
        self, hashes: Sequence[SequenceHash], token_chunks: Sequence[Sequence[int]]
    ) -> list[Block]:
        """The cached blocks for the longest hit prefix of ``hashes``.

        ``token_chunks[i]`` are the tokens of block ``i``; a cached block only counts as a
        hit if its tokens equal them. Stops at the first miss; ref counts are unchanged
        (call ``touch`` to take the hits).
        """
        if len(hashes) != len(token_chunks):
            raise ValueError(
                f"hashes has {len(hashes)} entries but token_chunks has {len(token_chunks)}"
            )
        hits: list[Block] = []
        for block_hash, tokens in zip(hashes, token_chunks, strict=True):
            block = self._cached.get(block_hash)
            if block is None or block.token_ids != tuple(tokens):
                break
            hits.append(block)
        return hits

    def num_cached_prefix(self, hashes: Sequence[SequenceHash]) -> int:
        """How many leading ``hashes`` the cache holds (by hash alone: ``get_cached_blocks``
        still compares their tokens)."""
        cached = self._cached
        for position, block_hash in enumerate(hashes):
            if block_hash not in cached:
                return position
        return len(hashes)

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on each block (a prefix hit); a free one leaves the free queue.

        The blocks are then ``reused``: freed again, they join the protected segment."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._free_queue.remove(block)
            block.ref_cnt += 1
            block.reused = True

    def allocate(self, num_blocks: int) -> list[Block]:
        """Take ``num_blocks`` blocks from the free queue head, evicting cached ones.

        Raises ``NoFreeBlocksError`` and changes nothing if fewer are free.
        """
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks!r}")
        if num_blocks > self.num_free_blocks:
            raise NoFreeBlocksError(num_blocks, self.num_free_blocks)
        blocks = self._free_queue.popleft_many(num_blocks)
        # `is not None`, not truthiness: 0 is a valid hash.
        cached = [block for block in blocks if block.block_hash is not None]
        if cached and self._eviction_listener is not None:
            self._eviction_listener(
                [block.block_id for block in cached], [self._identity(b) for b in cached]
            )
        evicted = [h for h in map(self._evict, cached) if h is not None]
        if evicted:
            self._emit(BlockRemoved(tuple(evicted)))
        for block in blocks:
            block.ref_cnt = 1
            block.reused = False
        return blocks

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference per block, in the given order.

        A block reaching 0 goes to the free queue tail, keeping its cache entry. Pass a
        request's blocks tail-first (or use ``free_request_blocks``) so its shared prefix
        is evicted last. Raises ``ValueError`` on a double free, changing nothing.
        """
        self._check_not_over_freed(blocks)
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_queue.append(block)

    def free_request_blocks(self, blocks: Sequence[Block]) -> None:
        """Free one request's blocks (given in sequence order) tail-first."""
        self.free(blocks[::-1])

    def cache_block(
        self,
        block: Block,
        block_hash: SequenceHash,
        parent_hash: SequenceHash | None,
        token_ids: Sequence[int],
    ) -> bool:
        """Register a full, referenced block in the prefix cache and emit ``BlockStored``.

        Returns True if this call registered it; False when prefix caching is disabled,
        the block is already registered under ``block_hash``, or another block holds
        that hash (this one is then a duplicate and stays uncached).
        """
        return self.cache_blocks([block], [block_hash], parent_hash, [token_ids]) == 1

    def cache_blocks(
        self,
        blocks: Sequence[Block],
        block_hashes: Sequence[SequenceHash],
        parent_hash: SequenceHash | None,
        token_chunks: Sequence[Sequence[int]],
    ) -> int:
        """``cache_block`` for consecutive full blocks of one sequence, each block the
        parent of the next (``parent_hash`` is the first one's parent); returns how many
        this call registered.

        One ``BlockStored`` per run of blocks registered here, not one per block (a
        prompt of 20k tokens is 300+ blocks: per-block events were most of the KV events'
        cost on both ends of the stream). Every block is checked before any is cached.
        """
        if not len(blocks) == len(block_hashes) == len(token_chunks):
            raise ValueError(
                f"cache_blocks got {len(blocks)} blocks, {len(block_hashes)} hashes and "
                f"{len(token_chunks)} token chunks; expected as many of each"
            )
        entries = [
            (block, block_hash, tuple(tokens))
            for block, block_hash, tokens in zip(blocks, block_hashes, token_chunks, strict=True)
        ]
        for block, block_hash, tokens in entries:
            self._check_cacheable(block, block_hash, tokens)
        if not self._enable_prefix_caching:
            return 0
        run: list[tuple[SequenceHash, tuple[int, ...]]] = []
        run_parent = parent = parent_hash
        registered = 0
        for block, block_hash, tokens in entries:
            if self._register(block, block_hash, parent, tokens):
                if not run:
                    run_parent = parent
                run.append((block_hash, tokens))
                registered += 1
            else:
                self._emit_stored(run, run_parent)
                run = []
            parent = block_hash
        self._emit_stored(run, run_parent)
        return registered

    def _register(
        self,
        block: Block,
        block_hash: SequenceHash,
        parent_hash: SequenceHash | None,
        tokens: tuple[int, ...],
    ) -> bool:
        if block.block_hash == block_hash or block_hash in self._cached:
            return False
        block.block_hash, block.token_ids = block_hash, tokens
        self._cached[block_hash] = block
        self._parent_of[block_hash] = parent_hash
        return True

    def _emit_stored(
        self, run: list[tuple[SequenceHash, tuple[int, ...]]], parent_hash: SequenceHash | None
    ) -> None:
        if not run:
            return
        hashes = tuple(block_hash for block_hash, _ in run)
        packed = b"".join(pack_token_ids(tokens) for _, tokens in run)
        self._emit(BlockStored(hashes, parent_hash, packed, self._block_size))

    def reset_prefix_cache(self) -> bool:
        """Drop the whole prefix cache and emit ``AllBlocksCleared``.

        Only allowed while no block is referenced (a running request's blocks must keep
        their identity); returns False and changes nothing otherwise.
        """
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self._cached.values():
            block.forget_hash()
        # Every block is free: requeued in eviction order, none protected.
        order = self._free_queue.popleft_many(self.num_blocks)
        for block in order:
            block.reused = False
        self._free_queue = SegmentedFreeQueue(order, self._protected_capacity)
        self._cached.clear()
        self._parent_of.clear()
        self._emit(AllBlocksCleared())
        return True

    def cached_block_hashes(self) -> list[SequenceHash]:
        """Every cached hash, in registration order (for a router resync dump)."""
        return list(self._cached)

    def cached_blocks(self) -> list[CachedBlock]:
        """Every cached block with its parent hash and tokens, in registration order.

        A block may come before its parent (the parent was evicted and cached again) or
        without it (the parent is gone); ``kv.prefix_index.KVCacheDump`` orders them.
        """
        return [self._identity(block) for block in self._cached.values()]

    def _identity(self, block: Block) -> CachedBlock:
        block_hash = block.block_hash
        if block_hash is None:
            raise ValueError(f"block {block.block_id} is not cached")
        return CachedBlock(block_hash, self._parent_of[block_hash], block.token_ids or ())

    def _evict(self, block: Block) -> SequenceHash | None:
        block_hash = block.block_hash
        if block_hash is None:
            return None
        del self._cached[block_hash]
        del self._parent_of[block_hash]
        block.forget_hash()
        return block_hash

    def _check_not_over_freed(self, blocks: Sequence[Block]) -> None:
        # Checked up front so a bad call leaves every ref count as it was.
        for block, times in Counter(blocks).items():
            if times > block.ref_cnt:
                raise ValueError(
                    f"double free of block {block.block_id}: freed {times} time(s) "
                    f"with ref_cnt {block.ref_cnt}"
                )

    def _check_cacheable(
        self, block: Block, block_hash: SequenceHash, tokens: tuple[int, ...]
    ) -> None:
        if len(tokens) != self._block_size:
            raise ValueError(
                f"token_ids has {len(tokens)} tokens; only full blocks of "
                f"{self._block_size} can be cached"
            )
        if block.ref_cnt == 0:
            raise ValueError(f"block {block.block_id} must be referenced to be cached")
        if block.block_hash is not None and block.block_hash != block_hash:
            raise ValueError(
                f"block {block.block_id} is already cached as {block.block_hash}, not {block_hash}"
            )

    def _emit(self, event: KVEvent) -> None:
        if self._event_log is not None:
            self._event_log.record(event)
