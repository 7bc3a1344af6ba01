"""The radix tree under the prefix indices: ``path`` makes and finds nodes."""

from __future__ import annotations

from dynask.kv.radix_tree import RadixTree


def test_path_makes_the_missing_nodes_and_reuses_the_others() -> None:
    tree: RadixTree[int] = RadixTree()
    first = tree.path(tree.root, [1, 2, 3])
    second = tree.path(tree.root, [1, 2, 4])

    assert [node.key for node in first] == [1, 2, 3]
    assert second[:2] == first[:2] and second[2] is not first[2]
    assert [node.parent for node in first] == [tree.root, first[0], first[1]]
    assert tree.num_nodes() == 4
    assert tree.path(first[1], [3]) == [first[2]]
    assert tree.path(tree.root, []) == []
