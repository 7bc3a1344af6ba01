"""The radix tree under the router's prefix indices: blocks by local hash, with holders.

Design decisions:

- A node is one KV block at one position of a prefix; its children are keyed by the
  *local* block hash (the hash of the block's own tokens), so the path from the root
  spells a prefix block by block, and the lookup of a prompt is one dict access per block.
- Each node maps the actors that hold the block to a value the owning index chooses: a
  reference count (``PrefixIndex``) or an expiry time (``ApproxIndex``). Only the keys
  matter to matching.
- A node with no holders and no children is pruned at once (``prune``), walking up, so
  blocks every actor dropped cost no memory.
- Matching walks from the root with the set of actors still matching; an actor drops out
  at the first block it lacks (contiguity), and the walk stops when none is left. The
  common step (every active actor holds the next block too) is one C-level subset test.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")


class RadixNode(Generic[V]):
    """One block of a prefix: its children by local hash and its holders."""

    __slots__ = ("children", "holders", "key", "parent")

    def __init__(self, key: int | None, parent: RadixNode[V] | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, RadixNode[V]] = {}
        self.holders: dict[str, V] = {}

    def __repr__(self) -> str:
        return (
            f"RadixNode(key={self.key!r}, holders={sorted(self.holders)!r}, "
            f"children={len(self.children)})"
        )


class RadixTree(Generic[V]):
    """Nodes by local-hash path; the owning index decides what the holder values mean."""

    def __init__(self) -> None:
        self.root: RadixNode[V] = RadixNode(None, None)

    def child(self, parent: RadixNode[V], local_hash: int) -> RadixNode[V]:
        """The child of ``parent`` under ``local_hash``, created if missing."""
        node = parent.children.get(local_hash)
        if node is None:
            node = RadixNode(local_hash, parent)
            parent.children[local_hash] = node
        return node

    def path(self, parent: RadixNode[V], local_hashes: Iterable[int]) -> list[RadixNode[V]]:
        """The nodes spelling ``local_hashes`` below ``parent``, in order, created where
        missing (``child`` once per block, in one loop: a long prompt has hundreds)."""
        nodes = []
        node = parent
        for local_hash in local_hashes:
            children = node.children
            child = children.get(local_hash)
            if child is None:
                child = children[local_hash] = RadixNode(local_hash, node)
            nodes.append(child)
            node = child
        return nodes

    def key_path(self, node: RadixNode[V]) -> list[int]:
        """The local hashes from the root to ``node`` (a walk up: one step per block)."""
        keys = []
        while node.parent is not None:
            keys.append(node.key)
            node = node.parent
        keys.reverse()
        return keys  # type: ignore[return-value]  # only the root has no key

    def prune(self, node: RadixNode[V]) -> None:
        """Detach ``node`` and its ancestors while they have no holders and no children."""
        while node.parent is not None and not node.holders and not node.children:
            parent = node.parent
            del parent.children[node.key]  # type: ignore[arg-type]  # only the root has no key
            node.parent = None
            node = parent

    def find_matches(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Per actor, how many leading blocks of ``local_hashes`` it holds contiguously.

        Actors that hold not even the first block are absent from the result.
        """
        matches: dict[str, int] = {}
        node = self.root.children.get(local_hashes[0]) if local_hashes else None
        if node is None:
            return matches
        active = set(node.holders)
        depth = 1
        for local_hash in local_hashes[1:]:
            if not active:
                return matches
            node = node.children.get(local_hash)
            if node is None:
                break
            holders = node.holders.keys()
            if not holders >= active:
                for actor in active - holders:
                    matches[actor] = depth
                active.intersection_update(holders)
            depth += 1
        for actor in active:
            matches[actor] = depth
        return matches

    def num_nodes(self) -> int:
        """Nodes below the root (a walk of the whole tree: for tests and diagnostics)."""
        count, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count
