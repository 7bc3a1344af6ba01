"""An approximate prefix index for engines that report no KV events.

Design decisions:

- The router tells the index where it sent each prompt (``note_routed``); the index then
  assumes that actor holds the prompt's blocks for ``ttl_s`` seconds (120 by default),
  about as long as an idle prefix survives LRU eviction under moderate load. Routing
  the same prefix again refreshes it.
- Same radix tree and the same ``find_matches`` as ``PrefixIndex``; a node's holder
  value is the block's expiry time on that actor.
- Expiry is lazy: a heap of (expiry, actor, node) entries is drained on every call. A
  refresh only raises the holder's expiry; its heap entry, when due, is pushed again at
  the new time. So the heap holds about one entry per (actor, block), however often a
  prefix is routed. Expired blocks are pruned from the tree: an idle index shrinks back
  to nothing.
- Pruning as the engine evicts: with a capacity an actor is assumed to hold at most that
  many blocks (its engine's KV cache); routing past it forgets blocks in the order the
  engine would evict them. ``capacity_blocks`` applies to every actor; ``set_actor_cache``
  gives one actor its own capacity and eviction policy (the control plane passes what the
  engine reported at start: its cache size and its protected share). Plain LRU (share 0,
  vLLM's policy) forgets the least recently routed block first. Segmented LRU (the
  built-in engine's and the mocker's ``prefix_cache_protected_share``, see
  ``kv.free_queue``): a block routed again while still assumed held is "reused" and moves
  to a protected segment of at most share x capacity blocks (beyond it the least recent
  is demoted), every other block to probation, and probation is forgotten first. A
  prompt's blocks are touched last block first, so its leading blocks are the most recent
  and a prefix is forgotten from its tail (the engine, too, evicts tail-first).
- ``forget`` takes back what was assumed of one block and everything routed below it:
  the exact index (``PrefixIndex``) calls it when an actor's KV events say the block
  left its cache, so a prompt routed there before cannot keep claiming a prefix the
  engine has since evicted (``ModelRouting``'s predicted blocks).
- The clock is injected (``clock``, or ``now=`` per call) so tests control time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import chain

from dynask.kv.radix_tree import RadixNode, RadixTree

DEFAULT_TTL_S = 120.0

_Node = RadixNode[float]  # holder value: when the block expires on that actor


class _ActorBlocks:
    """The blocks one actor is assumed to hold, in the order its engine would evict them:
    probation (routed once) least recent first, then protected (routed again)."""

    def __init__(self) -> None:
        # Values unused: ordered sets, least to most recently routed.
        self.probation: OrderedDict[_Node, None] = OrderedDict()
        self.protected: OrderedDict[_Node, None] = OrderedDict()
        self.capacity: int | None = None  # None: the TTL alone prunes
        self.protected_capacity = 0

    def __len__(self) -> int:
        return len(self.probation) + len(self.protected)

    def __iter__(self) -> Iterator[_Node]:
        return chain(self.probation, self.protected)

    def touch(self, node: _Node, held: bool) -> None:
        """``node`` was routed: most recent in probation, or protected if already held."""
        if held:
            self.probation.pop(node, None)
            self.protected[node] = None
            self.protected.move_to_end(node)
            while len(self.protected) > self.protected_capacity:
                demoted, _ = self.protected.popitem(last=False)
                self.probation[demoted] = None
        else:
            self.probation[node] = None

    def discard(self, node: _Node) -> None:
        if node in self.probation:
            del self.probation[node]
        else:
            self.protected.pop(node, None)

    def over_capacity(self) -> list[_Node]:
        """Takes out and returns the blocks beyond the capacity, first to evict first."""
        excess = 0 if self.capacity is None else len(self) - self.capacity
        evicted: list[_Node] = []
        for segment in (self.probation, self.protected):
            while excess > 0 and segment:
                evicted.append(segment.popitem(last=False)[0])
                excess -= 1
        return evicted


class ApproxIndex:
    """Which actors probably hold which prefix blocks, from where prompts were routed."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        capacity_blocks: int | None = None,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ApproxIndex ttl_s must be > 0, got {ttl_s!r}")
        _check_capacity(capacity_blocks)
        self.ttl_s = ttl_s
        self.capacity_blocks = capacity_blocks  # per actor; None: the TTL alone prunes
        self._clock = clock
        self._tree: RadixTree[float] = RadixTree()
        self._blocks_of: dict[str, _ActorBlocks] = {}
        # An actor's own cache, from ``set_actor_cache``: (capacity, protected share).
        self._cache_of: dict[str, tuple[int | None, float]] = {}
        # (expiry, tie-breaker, actor, node); the counter keeps nodes out of comparisons.
        self._expiries: list[tuple[float, int, str, _Node]] = []
        self._counter = itertools.count()
        self._latest_expiry = -math.inf  # the largest expiry pushed

    def set_actor_cache(
        self, actor: str, capacity_blocks: int | None, protected_share: float = 0.0
    ) -> None:
        """Assume ``actor``'s engine holds at most ``capacity_blocks`` blocks (None: the
        index's ``capacity_blocks``) and evicts segmented LRU with ``protected_share`` of
        them protected (0: plain LRU); see the module docstring."""
        _check_capacity(capacity_blocks)
        if isinstance(protected_share, bool) or not 0.0 <= protected_share <= 1.0:
            raise ValueError(
                f"ApproxIndex protected_share has value {protected_share!r}; "
                "expected a number in [0, 1]"
            )
        self._cache_of[actor] = (capacity_blocks, float(protected_share))
        blocks = self._blocks_of.get(actor)
        if blocks is not None:
            self._shape(actor, blocks)
            self._evict(actor, blocks)

    def note_routed(
        self, actor: str, local_hashes: Sequence[int], now: float | None = None
    ) -> None:
        """Assume ``actor`` holds these leading blocks from ``now`` for ``ttl_s``."""
        if not isinstance(actor, str) or not actor:
            raise ValueError(f"actor id has value {actor!r}; expected a non-empty string")
        now = self._now(now)
        self._expire(now)
        expiry = now + self.ttl_s
        blocks = self._blocks_of.get(actor)
        if blocks is None:
            blocks = self._blocks_of[actor] = self._shape(actor, _ActorBlocks())
        touch, counter = blocks.touch, self._counter
        if expiry >= self._latest_expiry:  # later than every entry: appending keeps a heap
            self._latest_expiry = expiry
            push = self._expiries.append
        else:  # a clock that went back (``now=`` from a test)
            push = partial(heapq.heappush, self._expiries)
        for node in reversed(self._tree.path(self._tree.root, local_hashes)):
            holders = node.holders  # the leading block ends up most recent
            held = actor in holders
            if not held:
                push((expiry, next(counter), actor, node))
            touch(node, held)
            holders[actor] = expiry
        self._evict(actor, blocks)

    def _shape(self, actor: str, blocks: _ActorBlocks) -> _ActorBlocks:
        capacity, share = self._cache_of.get(actor, (None, 0.0))
        blocks.capacity = self.capacity_blocks if capacity is None else capacity
        blocks.protected_capacity = int(share * blocks.capacity) if blocks.capacity else 0
        return blocks

    def _evict(self, actor: str, blocks: _ActorBlocks) -> None:
        for node in blocks.over_capacity():
            del node.holders[actor]
            self._tree.prune(node)
        if not blocks:
            del self._blocks_of[actor]

    def find_matches(self, local_hashes: Sequence[int], now: float | None = None) -> dict[str, int]:
        """Per actor, how many leading blocks of the query it probably holds.

        Actors that hold not even the first block are absent (their overlap is 0).
        """
        self._expire(self._now(now))
        return self._tree.find_matches(local_hashes)

    def forget(self, actor: str, local_hashes: Sequence[int]) -> None:
        """Stop assuming ``actor`` holds the block at the end of ``local_hashes`` or any
        block routed below it (an empty path: all its blocks)."""
        node = self._tree.root
        for local_hash in local_hashes:
            child = node.children.get(local_hash)
            if child is None or actor not in child.holders:
                return
            node = child
        blocks = self._blocks_of.get(actor)
        if blocks is None:
            return
        dropped: list[_Node] = []
        stack = [node] if local_hashes else list(node.children.values())
        while stack:
            below = stack.pop()
            if below.holders.pop(actor, None) is not None:
                blocks.discard(below)
                dropped.append(below)
                stack.extend(below.children.values())
        for below in reversed(dropped):  # deepest first: a leaf's pruning walks up
            self._tree.prune(below)
        if not blocks:
            del self._blocks_of[actor]

    def remove_actor(self, actor: str) -> None:
        """Forget ``actor``'s blocks (it died or left); a no-op for an unknown actor."""
        for node in self._blocks_of.pop(actor, ()):
            del node.holders[actor]
            self._tree.prune(node)

    def num_blocks(self, actor: str, now: float | None = None) -> int:
        """How many blocks ``actor`` is assumed to hold now."""
        self._expire(self._now(now))
        return len(self._blocks_of.get(actor, ()))

    def actors(self, now: float | None = None) -> list[str]:
        """Actors assumed to hold at least one block now."""
        self._expire(self._now(now))
        return list(self._blocks_of)

    def num_nodes(self) -> int:
        """Nodes in the tree (a full walk: for tests and diagnostics)."""
        return self._tree.num_nodes()

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _push(self, expiry: float, actor: str, node: _Node) -> None:
        heapq.heappush(self._expiries, (expiry, next(self._counter), actor, node))

    def _expire(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            expiry, _, actor, node = heapq.heappop(expiries)
            current = node.holders.get(actor)
            if current is None:
                continue  # its actor was removed, or the block pruned as least recent
            if current > expiry:
                self._push(current, actor, node)  # refreshed since
                continue
            del node.holders[actor]
            blocks = self._blocks_of[actor]
            blocks.discard(node)
            if not blocks:
                del self._blocks_of[actor]
            self._tree.prune(node)


def _check_capacity(capacity_blocks: int | None) -> None:
    if capacity_blocks is not None and (
        isinstance(capacity_blocks, bool)
        or not isinstance(capacity_blocks, int)
        or capacity_blocks < 1
    ):
        raise ValueError(
            f"ApproxIndex capacity_blocks has value {capacity_blocks!r}; expected an int >= 1"
        )
