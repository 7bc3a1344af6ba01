"""Which KV blocks each sequence holds: prefix-cache lookups, slot allocation, freeing.

A thin layer between the scheduler and the block pool (``dynask.kv.block_pool``): the
scheduler asks "can this sequence get N more tokens?" and never touches blocks itself.
With offload tiers (``offload``, a ``kv.offload.KVOffload``), a scheduling lookup
continues a device-cache hit into host memory and disk, and ``allocate`` loads those
blocks into fresh device blocks instead of having them recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dynask.actors.engine.sequence import Sequence
from dynask.kv.block import ceil_div
from dynask.kv.block_pool import DEFAULT_PROTECTED_SHARE, Block, BlockPool, CachedBlock
from dynask.kv.events import KVEventLog
from dynask.kv.hashing import SequenceHash, chain_hash, local_block_hash, local_block_hashes
from dynask.kv.offload import KVOffload, Onboarding


@dataclass(frozen=True)
class PrefixHit:
    """Leading full blocks of a sequence already cached: on the device, then below.

    ``lower`` continues the device hit with blocks held in the host or disk tier, to be
    loaded when the sequence gets its blocks.
    """

    blocks: list[Block]
    hashes: list[SequenceHash]
    lower: list[CachedBlock] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks) + len(self.lower)


NO_HIT = PrefixHit([], [])


class KVCacheManager:
    """Maps sequences to blocks of a ``BlockPool`` of ``block_size`` tokens each."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.offload: KVOffload | None = None

    def attach_offload(self, offload: KVOffload) -> None:
        """Sends evicted blocks to ``offload``'s tiers and looks prefixes up there too."""
        self.offload = offload
        self.pool.set_eviction_listener(offload.on_device_evicted)

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block; the pool emits ``AllBlocksCleared``, so the routers
        following this engine's KV events drop its blocks too. False, changing nothing,
        while a request holds blocks. Raises ``ValueError`` with offload tiers: their
        copies would still be found, and a reset that leaves hits behind is no reset."""
        if self.offload is not None:
            raise ValueError(
                "this engine has KV offload tiers (host/disk), which a prefix cache reset "
                "does not empty; restart the engine to start cold"
            )
        return self.pool.reset_prefix_cache()

    @classmethod
    def build(
        cls,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        protected_share: float = DEFAULT_PROTECTED_SHARE,
    ) -> tuple[KVCacheManager, KVEventLog]:
        """A manager over a fresh pool, and the event log that pool reports to."""
        event_log = KVEventLog()
        pool = BlockPool(
            num_blocks,
            block_size,
            enable_prefix_caching=enable_prefix_caching,
            event_log=event_log,
            protected_share=protected_share,
        )
        return cls(pool, block_size), event_log

    def lookup_prefix(self, seq: Sequence) -> PrefixHit:
        """Cached blocks for the sequence's leading full blocks.

        At least one token is always left to compute (its logits give the next token), so
        a fully cached prompt reuses all but its last block. The blocks' hashes are the
        sequence's own (``full_block_hashes``), computed once however often it is looked up.
        """
        num_blocks = (seq.num_tokens - 1) // self.block_size
        hashes = self.full_block_hashes(seq, num_blocks)
        if self.offload is not None:  # the lower tiers check every block's tokens
            chunks = [self._block_tokens(seq, index) for index in range(num_blocks)]
            return self._lookup(hashes, chunks, lower_tiers=True)
        # Only the blocks whose hash is cached have their tokens compared (a long prompt's
        # tail is usually a miss: slicing it would cost more than the lookup).
        hit = self.pool.num_cached_prefix(hashes)
        return self._lookup(hashes[:hit], [self._block_tokens(seq, i) for i in range(hit)])

    def lookup_tokens(
        self, tokens: list[int], seed: int, *, lower_tiers: bool = False
    ) -> PrefixHit:
        """Cached blocks for the leading full blocks of ``tokens``.

        Device tier only, unless ``lower_tiers`` (then ``PrefixHit.lower`` continues it).
        """
        chunks, hashes = self.hash_blocks(tokens, seed, len(tokens) // self.block_size)
        return self._lookup(hashes, chunks, lower_tiers=lower_tiers)

    def _lookup(
        self, hashes: list[SequenceHash], chunks: list[list[int]], *, lower_tiers: bool = False
    ) -> PrefixHit:
        blocks = self.pool.get_cached_blocks(hashes, chunks)
        hit = len(blocks)
        lower = []
        if lower_tiers and self.offload is not None:
            lower = self.offload.find(hashes[hit:], chunks[hit:])
        return PrefixHit(blocks, hashes[:hit], lower)

    def full_block_hashes(self, seq: Sequence, num_blocks: int) -> list[SequenceHash]:
        """The sequence hashes of ``seq``'s first ``num_blocks`` full blocks, hashed once
        per request."""
        memo = seq.hashed_blocks
        first = len(memo)
        if first < num_blocks:  # the new blocks' tokens packed once (``local_block_hashes``)
            size, prompt = self.block_size, seq.prompt_token_ids
            start, end = first * size, num_blocks * size
            tokens = prompt[start:end] if end <= len(prompt) else seq.token_ids()[start:end]
            parent = memo[-1] if memo else None
            for local in local_block_hashes(tokens, size, seq.hash_seed):
                parent = chain_hash(parent, local, seq.hash_seed)
                memo.append(parent)
        return memo[:num_blocks]

    def _block_tokens(self, seq: Sequence, index: int) -> list[int]:
        """Block ``index`` of ``seq.token_ids()``, without copying the whole sequence (a
        prompt runs to 100k+ tokens; ``token_ids()`` copies all of them)."""
        start, end = index * self.block_size, (index + 1) * self.block_size
        prompt = seq.prompt_token_ids
        if end <= len(prompt):
            return prompt[start:end]
        head = prompt[start:] if start < len(prompt) else []
        return head + seq.output_token_ids[max(0, start - len(prompt)) : end - len(prompt)]

    def store_prefix(
        self, tokens: list[int], seed: int, num_blocks: int, write: Callable[[list[int]], None]
    ) -> int:
        """Allocates ``num_blocks`` blocks, lets ``write`` fill them, caches them, unpins them."""
        chunks, hashes = self.hash_blocks(tokens, seed, num_blocks)
        if len(chunks) < num_blocks:
            raise ValueError(
                f"KV for {num_blocks} blocks needs {num_blocks * self.block_size} tokens; "
                f"got {len(tokens)}"
            )
        blocks = self.pool.allocate(num_blocks)
        try:
            write([int(b.block_id) for b in blocks])
            self.pool.cache_blocks(blocks, hashes, None, chunks)
        finally:
            self.pool.free_request_blocks(blocks)
        return num_blocks

    def hash_blocks(
        self, tokens: list[int], seed: int, num_blocks: int
    ) -> tuple[list[list[int]], list[SequenceHash]]:
        """Tokens and chained hashes of the first ``num_blocks`` full blocks (fewer if
        ``tokens`` holds fewer)."""
        chunks = [
            self._chunk(tokens, i) for i in range(min(num_blocks, len(tokens) // self.block_size))
        ]
        hashes: list[SequenceHash] = []
        parent: SequenceHash | None = None
        for chunk in chunks:
            parent = chain_hash(parent, local_block_hash(chunk, seed), seed)
            hashes.append(parent)
        return chunks, hashes

    def allocate(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Reserves blocks for ``num_new_tokens`` more tokens (after ``hit``).

        False if the blocks are not free, or while the hit's disk blocks are still being
        read in the background (the sequence then waits, like one that does not fit).
        """
        computed = seq.num_computed_tokens + hit.num_blocks * self.block_size
        blocks_needed = ceil_div(computed + num_new_tokens, self.block_size)
        if blocks_needed <= len(seq.blocks) and hit is NO_HIT:
            return True  # most decode steps: the last block still has room
        new_blocks = blocks_needed - len(seq.blocks) - len(hit.blocks)  # lower: new blocks too
        revived = sum(1 for block in hit.blocks if block.ref_cnt == 0)
        if new_blocks > self.pool.num_free_blocks - revived:
            return False
        # Prepare the lower tiers' blocks first (disk files read, host blocks held): the
        # allocation below evicts device blocks into those tiers.
        onboarding = self._prepare_lower(hit)
        if onboarding.waiting:
            return False  # its disk blocks are being read; the others run meanwhile
        if hit.blocks:
            self.pool.touch(hit.blocks)
            seq.blocks.extend(hit.blocks)
            seq.block_hashes.extend(hit.hashes)
            self._note_uses(hit.hashes)
        seq.num_computed_tokens += (len(hit.blocks) + onboarding.num_blocks) * self.block_size
        if new_blocks > 0:  # always when onboarding: its blocks are new blocks
            fresh = self.pool.allocate(new_blocks)
            seq.blocks.extend(fresh)
            self._onboard(seq, fresh[: onboarding.num_blocks], onboarding)
        return True

    def _prepare_lower(self, hit: PrefixHit) -> Onboarding:
        if not hit.lower or self.offload is None:
            return Onboarding()
        return self.offload.prepare(hit.lower)

    def _onboard(self, seq: Sequence, blocks: list[Block], onboarding: Onboarding) -> None:
        """Fills fresh blocks from the lower tiers and caches them as computed."""
        if not onboarding.blocks or self.offload is None:
            return
        self.offload.place([int(b.block_id) for b in blocks], onboarding)
        for block, loaded in zip(blocks, onboarding.blocks, strict=True):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            self.pool.cache_block(block, loaded.block_hash, parent, loaded.token_ids)
            seq.block_hashes.append(loaded.block_hash)
        self._note_uses(b.block_hash for b in onboarding.blocks)

    def _note_uses(self, hashes: Iterable[SequenceHash]) -> None:
        if self.offload is not None:
            self.offload.note_uses(hashes)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers every block that became full and computed in the prefix cache (one
        ``cache_blocks`` call: one KV event for the step's new blocks, not one per block)."""
        full = seq.num_computed_tokens // self.block_size
        first = len(seq.block_hashes)
        if first >= full:
            return
        hashes = self.full_block_hashes(seq, full)[first:]
        chunks = [self._block_tokens(seq, index) for index in range(first, full)]
        parent = seq.block_hashes[-1] if first else None
        self.pool.cache_blocks(seq.blocks[first:full], hashes, parent, chunks)
        seq.block_hashes.extend(hashes)
        self._note_uses(hashes)

    def free(self, seq: Sequence) -> None:
        """Returns the sequence's blocks, tail first, so shared prefixes are evicted last."""
        self.pool.free_request_blocks(seq.blocks)
        seq.blocks = []
        seq.block_hashes = []

    def _chunk(self, tokens: list[int], index: int) -> list[int]:
        return tokens[index * self.block_size : (index + 1) * self.block_size]
