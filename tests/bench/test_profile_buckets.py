"""``profile_buckets``: samples go to the first bucket their stack names; waiting apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.routing.profile_buckets import buckets


def test_samples_go_to_the_first_matching_bucket_and_idle_stays_apart(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "run (a.py:1);EpollSelector.select (selectors.py:468) 50\n"
        "run (a.py:1);ActorHandle._read (h.py:1);read_frame (t.py:73) 30\n"  # frames first
        "run (a.py:1);ActorHandle._read (h.py:1);PrefixIndex.apply (p.py:1) 15\n"
        "run (a.py:1);mystery (m.py:2) 5\n"
    )

    result = buckets(raw)

    assert (result["samples"], result["idle_share"]) == (100, 0.5)
    shares = result["work_shares"]
    assert shares["token stream frames (msgpack)"] == pytest.approx(0.6)
    assert shares["KV events: prefix index (hashing, tree)"] == pytest.approx(0.3)
    assert shares["other"] == pytest.approx(0.1)
    assert shares["deltas: dispatch to requests"] == 0
    assert sum(shares.values()) == pytest.approx(1.0)
