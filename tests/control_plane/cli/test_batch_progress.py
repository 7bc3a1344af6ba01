"""in=batch's progress bar: finished requests, and output tokens/s as tokens arrive."""

from __future__ import annotations

import io

from dynask.control_plane.cli.batch_input import BatchProgress


def test_the_bar_counts_requests_and_shows_tokens_per_second() -> None:
    out = io.StringIO()
    with BatchProgress(2, file=out) as progress:
        progress.generated(3)
        progress.generated(4)
        progress.finished()
        progress.generated(5)
        progress.finished()
    assert progress.tokens == 12
    assert progress.bar.n == 2
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("batch: 100%")
    assert "2/2" in final and " tok/s]" in final
    assert progress.tokens_per_s() > 0
