"""The start-up kernel chooser's rules (``kernel_chooser``), without a GPU: which tile it
keeps for given timings, which candidates it drops before timing, how many copies of a
weight it times on."""

from __future__ import annotations

import pytest
import torch

from dynask.actors.engine.cuda import kernel_chooser, skinny_matmul
from dynask.actors.engine.cuda.skinny_matmul import MARGIN, Tile


def test_the_chooser_times_on_enough_copies_to_miss_the_l2() -> None:
    l2 = 60 << 20  # an H200's
    assert kernel_chooser.copies_wanted(4096 * 4096 * 2, l2) == 4  # o: 32 MiB, 3.75 of them
    assert kernel_chooser.copies_wanted(6144 * 4096 * 2, l2) == 3  # q|k|v: 48 MiB
    assert kernel_chooser.copies_wanted(28672 * 4096 * 2, l2) == 1  # gate|up: 224 MiB
    assert kernel_chooser.copies_wanted(1 << 20, l2) == kernel_chooser.MAX_COPIES


def test_chooser_keeps_cublas_unless_triton_wins_by_the_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timings = [10.0, 9.8, 9.6, 12.0]  # cuBLAS, then the tiles: 9.8 > 0.97 * 10 > 9.6
    monkeypatch.setattr(kernel_chooser, "_times", lambda runs, weights: timings[: len(runs)])
    tiles = [Tile(16, 512), Tile(32, 256), Tile(8, 1024)]
    weights = [torch.zeros(1)]
    chosen = kernel_chooser.fastest(tiles, lambda w: None, lambda tile, w: None, weights, MARGIN)
    assert chosen == tiles[1]
    timings = [10.0, 9.9, 9.8, 9.75]
    assert (
        kernel_chooser.fastest(tiles, lambda w: None, lambda tile, w: None, weights, MARGIN) is None
    )
    assert kernel_chooser.fastest([], lambda w: None, lambda tile, w: None, weights, MARGIN) is None


def _record_timings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Replaces the timing: the unfused ops take 10 ms, the first tile timed 9 ms; the
    list returned gets how many runs each timing was asked for."""
    timed: list[int] = []

    def times(runs: list[object], weights: object) -> list[float]:
        timed.append(len(runs))
        return [10.0, 9.0][: len(runs)]

    monkeypatch.setattr(kernel_chooser, "_times", times)
    return timed


def test_the_chooser_times_only_the_tiles_that_run(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = _record_timings(monkeypatch)
    tiles = [Tile(16, 512), Tile(8, 1024)]

    def fused(tile: Tile, weight: torch.Tensor) -> None:
        if tile == tiles[0]:
            raise RuntimeError("out of resources")

    chosen = kernel_chooser.fastest(tiles, lambda w: None, fused, [torch.zeros(1)], MARGIN)
    assert chosen == tiles[1] and timed == [2]  # cuBLAS and the tile that ran, together
    timed.clear()
    assert (
        kernel_chooser.fastest(tiles[:1], lambda w: None, fused, [torch.zeros(1)], MARGIN) is None
    )
    assert timed == []  # nothing left to compare with


def test_with_pdl_the_chooser_keeps_triton_unless_cublas_is_clearly_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiles = [Tile(16, 512), Tile(8, 1024)]
    weights = [torch.zeros(1)]
    margin = skinny_matmul.PDL_MARGIN
    timings = [10.0, 10.2, 12.0]  # 10.2 < 1.03 * 10: a tie goes to Triton
    monkeypatch.setattr(kernel_chooser, "_times", lambda runs, weights: timings[: len(runs)])
    chosen = kernel_chooser.fastest(tiles, lambda w: None, lambda tile, w: None, weights, margin)
    assert chosen == tiles[0]
    timings = [10.0, 10.4, 10.31]  # both more than 3% slower: cuBLAS
    chosen = kernel_chooser.fastest(tiles, lambda w: None, lambda tile, w: None, weights, margin)
    assert chosen is None


def test_a_tile_whose_output_differs_is_dropped_before_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed = _record_timings(monkeypatch)
    tiles = [Tile(16, 512), Tile(8, 1024)]
    expected = torch.arange(16.0).reshape(4, 4)

    def fused(tile: Tile, weight: torch.Tensor) -> torch.Tensor:
        if tile == tiles[0]:  # one element wrong by a tenth of the largest value (15)
            wrong = expected.clone()
            wrong[2, 1] += 1.5
            return wrong
        return expected * (1 + 1e-3)  # another summation order

    chosen = kernel_chooser.fastest(tiles, lambda w: expected, fused, [torch.zeros(1)], MARGIN)
    assert chosen == tiles[1] and timed == [2]


def test_same_output_allows_summation_order_and_nothing_more() -> None:
    want = torch.tensor([[1.0, -2.0], [4.0, 100.0]])
    assert kernel_chooser.same_output(want, want)
    assert kernel_chooser.same_output(want + 1.99, want)  # within 2% of the largest, 100
    assert not kernel_chooser.same_output(want + torch.tensor([[0.0, 0.0], [2.01, 0.0]]), want)
    assert not kernel_chooser.same_output(want[:1], want)  # another shape
    assert not kernel_chooser.same_output(want * float("nan"), want)
    assert not kernel_chooser.same_output(torch.ones(2, 2), torch.zeros(2, 2))
    assert kernel_chooser.same_output(None, want)  # nothing to compare
