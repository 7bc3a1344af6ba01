"""``settle_heap``: what is alive is frozen, the young threshold raised."""

from __future__ import annotations

import gc

from dynask.control_plane.serving.gc_policy import YOUNG_THRESHOLD, settle_heap


def test_settle_heap_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    threshold = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, threshold[1], threshold[2])
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
