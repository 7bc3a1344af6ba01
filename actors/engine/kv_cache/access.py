"""The built-in engine's KV-cache API for threads other than the engine's: the prefix cache
dump a router resyncs from, KV export and import for hand-off between actors, prefix
lookups and stores. Each call takes the engine's step lock, under which every change to
the block pool happens, so the engine thread never sees a half-made change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from dynask.actors.engine.engine_parts import EngineParts
from dynask.actors.engine.kv_cache.manager import KVCacheManager, PrefixHit
from dynask.kv.events import KVEventLog
from dynask.kv.hashing import hash_seed
from dynask.kv.prefix_index import KVCacheDump

T = TypeVar("T")


class EngineKVAccess:
    """What ``LLMEngine`` offers other threads on its KV cache (its base class)."""

    parts: EngineParts
    kv_events: KVEventLog
    _step_lock: threading.Lock

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block (the router hashes prompts in blocks of this size)."""
        return self.parts.kv_manager.block_size

    @property
    def kv_protected_share(self) -> float:
        """How the prefix cache evicts (``kv.free_queue``; 0: plain LRU), for routers that
        model it without KV events."""
        return self.parts.kv_manager.pool.protected_share

    def kv_cache_dump(self) -> KVCacheDump:
        """The whole prefix cache, as of the last KV event recorded (for a router resync).

        Taken under the step lock: every change to the block pool happens under it, so
        no event is recorded between reading the cache and reading the event id.
        """
        with self._step_lock:
            offload = self.parts.kv_manager.offload
            return KVCacheDump.from_block_pool(
                self.parts.kv_manager.pool,
                self.kv_events.last_event_id,
                lower_tiers=offload.cached_blocks() if offload is not None else (),
            )

    def reset_prefix_cache(self) -> bool:
        """``KVCacheManager.reset_prefix_cache`` under the step lock (any thread)."""
        with self._step_lock:
            return self.parts.kv_manager.reset_prefix_cache()

    def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        """KV of the given blocks (``[layers, 2, blocks, block_size, kv_heads, head_dim]``)."""
        with self._step_lock:
            return self.parts.runner.export_blocks(block_ids)

    def import_kv(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Writes KV produced by ``export_kv`` (possibly on another engine) into blocks."""
        with self._step_lock:
            self.parts.runner.import_blocks(block_ids, kv)

    def cached_prefix(self, token_ids: list[int], extra_keys: tuple[str, ...] = ()) -> PrefixHit:
        """The leading full blocks of ``token_ids`` this engine holds in its prefix cache."""
        with self._step_lock:
            return self.parts.kv_manager.lookup_tokens(token_ids, hash_seed(extra_keys))

    def store_prefix(
        self, token_ids: list[int], kv: torch.Tensor, extra_keys: tuple[str, ...] = ()
    ) -> int:
        """Loads KV computed elsewhere for the full blocks of ``token_ids`` into the cache.

        ``kv`` covers the first ``kv.shape[2]`` full blocks (as ``export_kv`` gives them).
        The blocks are registered in the prefix cache and left unreferenced, so the next
        request with this prefix starts after them. Returns the number of blocks stored.
        """
        with self._step_lock:
            return self.parts.kv_manager.store_prefix(
                token_ids,
                hash_seed(extra_keys),
                kv.shape[2],
                lambda ids: self.parts.runner.import_blocks(ids, kv),
            )

    def with_kv_blocks(self, action: Callable[[KVCacheManager], T]) -> T:
        """Runs ``action`` on the KV cache manager under the step lock, so the engine
        thread never sees a half-made change (KV hand-off between actors uses it)."""
        with self._step_lock:
            return action(self.parts.kv_manager)
