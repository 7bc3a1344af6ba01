"""Scaling down retires the newest actors: names compare by their number, not as text."""

from __future__ import annotations

from dynask.control_plane.cluster.retiring import newest_first


def test_newest_first_orders_actor_numbers_as_numbers() -> None:
    names = ["decode-9", "decode-10", "decode-2", "prefill-0", "odd"]
    ordered = [name for name, _ in sorted(((n, None) for n in names), key=newest_first)]
    assert ordered == ["decode-2", "decode-9", "decode-10", "odd", "prefill-0"]
    newest = sorted(((n, None) for n in names), key=newest_first, reverse=True)
    assert next(n for n, _ in newest if n.startswith("decode")) == "decode-10"
