"""Block bookkeeping for KV computed on one engine and used on another.

The decode side *reserves* before any byte moves: it takes a reference on the leading
blocks of the prompt it already caches and allocates blocks for the rest, so the
transfer can neither find the cache full nor lose the local hits to eviction. When the
KV has been written into the new blocks, ``commit_import`` registers them in the prefix
cache under the prompt's block hashes; the request is then queued as usual and admitted
as a prefix hit on every moved block. ``release`` drops the reservation's references
(after commit the blocks stay cached; after a failure the new ones are plain free
blocks again).

The prefill side *pins* the prompt's blocks from its prefix cache while it exports them.

Only full blocks move, and never the prompt's last token: the decode engine computes
the tail itself, so it samples the first output token with its own sampling state.

Every function here must run under the engine's step lock (``LLMEngine.with_kv_blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dynask.actors.engine.kv_cache.manager import KVCacheManager
from dynask.kv.block_pool import Block
from dynask.kv.hashing import SequenceHash


@dataclass(frozen=True)
class ImportReservation:
    """Blocks a decode engine holds for a prompt whose KV comes from elsewhere."""

    held: list[Block]  # leading blocks already cached here (referenced by the reservation)
    incoming: list[Block]  # allocated for the blocks that will arrive, in prompt order
    hashes: list[SequenceHash]  # of every full block covered (held, then incoming)
    chunks: list[list[int]]  # their tokens

    @property
    def first_incoming(self) -> int:
        """Index (in the prompt's blocks) of the first block that must arrive."""
        return len(self.held)

    @property
    def incoming_ids(self) -> list[int]:
        return [int(block.block_id) for block in self.incoming]

    @property
    def blocks(self) -> list[Block]:
        return self.held + self.incoming


def movable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full prompt blocks that may be moved: all but the one holding the last token."""
    return max(0, (num_prompt_tokens - 1) // block_size)


def reserve_import(kv: KVCacheManager, token_ids: list[int], seed: int) -> ImportReservation | None:
    """Reserves blocks for the prompt's movable blocks; None when nothing needs to move
    (all cached here) or the pool lacks room (the caller prefills locally then)."""
    num_blocks = movable_blocks(len(token_ids), kv.block_size)
    chunks, hashes = kv.hash_blocks(token_ids, seed, num_blocks)
    held = kv.pool.get_cached_blocks(hashes, chunks)
    missing = num_blocks - len(held)
    revived = sum(1 for block in held if block.ref_cnt == 0)
    if missing <= 0 or missing > kv.pool.num_free_blocks - revived:
        return None
    kv.pool.touch(held)
    incoming = kv.pool.allocate(missing)
    return ImportReservation(held, incoming, hashes, chunks)


def commit_import(kv: KVCacheManager, reservation: ImportReservation) -> None:
    """Registers the incoming blocks (their KV written) in the prefix cache."""
    start = reservation.first_incoming
    for offset, block in enumerate(reservation.incoming):
        index = start + offset
        parent = reservation.hashes[index - 1] if index else None
        kv.pool.cache_block(block, reservation.hashes[index], parent, reservation.chunks[index])


def release(kv: KVCacheManager, blocks: list[Block]) -> None:
    """Drops one reference per block (given in prompt order), tail first."""
    kv.pool.free_request_blocks(blocks)


def pin_prefix(kv: KVCacheManager, token_ids: list[int], seed: int) -> list[Block]:
    """References the cached leading full blocks of ``token_ids`` (release them after)."""
    hit = kv.lookup_tokens(token_ids, seed)
    kv.pool.touch(hit.blocks)
    return hit.blocks
