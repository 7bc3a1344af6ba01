"""The weighted fair queue of waiting requests: exact turn orders."""

from __future__ import annotations

import pytest

from dynask.control_plane.serving.fair_queue import FairQueue


def _drain(queue: FairQueue[str]) -> list[str]:
    order = []
    while (item := queue.pop()) is not None:
        order.append(item)
    return order


def test_classes_share_by_weight_and_none_starves() -> None:
    queue: FairQueue[str] = FairQueue({"high": 4, "normal": 2, "low": 1})
    for i in range(8):
        for priority in ("low", "normal", "high"):
            queue.push(f"{priority[0]}{i}", priority, "t")

    order = _drain(queue)

    # Rounds in the order the classes first waited: low 1, normal 2, high 4 per round.
    assert order[:14] == [
        "l0", "n0", "n1", "h0", "h1", "h2", "h3",
        "l1", "n2", "n3", "h4", "h5", "h6", "h7",
    ]  # fmt: skip
    # high emptied: low 1, normal 2 per round, then low alone.
    assert order[14:] == ["l2", "n4", "n5", "l3", "n6", "n7", "l4", "l5", "l6", "l7"]


def test_tenants_of_a_class_take_turns() -> None:
    queue: FairQueue[str] = FairQueue({"normal": 1})
    for i in range(4):
        queue.push(f"noisy{i}", "normal", "noisy")
    queue.push("quiet0", "normal", "quiet")
    queue.push("quiet1", "normal", "quiet")

    assert _drain(queue) == ["noisy0", "quiet0", "noisy1", "quiet1", "noisy2", "noisy3"]


def test_an_emptied_class_keeps_no_credit() -> None:
    queue: FairQueue[str] = FairQueue({"high": 3, "low": 1})
    queue.push("h0", "high", "t")
    assert queue.pop() == "h0"  # high's quantum was 3; it emptied with 2 unused
    for i in range(3):
        queue.push(f"l{i}", "low", "t")
        queue.push(f"h{i + 1}", "high", "t")
    assert _drain(queue) == ["l0", "h1", "h2", "h3", "l1", "l2"]


def test_a_waiter_that_gives_up_leaves_its_turn() -> None:
    queue: FairQueue[str] = FairQueue({"high": 2, "low": 1})
    queue.push("l0", "low", "a")
    queue.push("h0", "high", "a")
    queue.push("h1", "high", "b")

    assert queue.remove("l0") and not queue.remove("l0")
    assert len(queue) == 2 and queue.waiting("low") == 0 and "h1" in queue
    assert _drain(queue) == ["h0", "h1"]
    assert len(queue) == 0 and queue.pop() is None


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="'weights' has value {'high': 0}"):
        FairQueue({"high": 0})
    queue: FairQueue[str] = FairQueue({"normal": 1})
    with pytest.raises(ValueError, match="priority 'urgent' is not one of normal"):
        queue.push("x", "urgent", "t")
    queue.push("x", "normal", "t")
    with pytest.raises(ValueError, match="'x' is already waiting"):
        queue.push("x", "normal", "t")
