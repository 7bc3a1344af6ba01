"""The TMA skinny GEMM sweep's tile list (``bench.engine.skinny_tma``)."""

from __future__ import annotations

from bench.engine import skinny_tma


def test_the_sweep_offers_only_tiles_that_divide_the_weight() -> None:
    tiles = skinny_tma.tma_tiles(4096, 14336)  # Llama-3.1-8B's down projection
    assert tiles and all(t.fits(4096, 14336) for t in tiles)
    split = [t for t in tiles if not t.stream_k]
    assert all(96 <= 4096 // t.block_n * t.split_k <= 1056 for t in split)
    shapes = {(t.block_n, t.block_k, t.split_k) for t in split}
    assert (32, 64, 8) in shapes and (128, 128, 8) in shapes
    assert (128, 64, 1) not in shapes  # 32 programs: a quarter of the SMs


def test_the_sweep_offers_stream_k_tiles_whose_stages_fit_beside_a_second_tile() -> None:
    stream = [t for t in skinny_tma.tma_tiles(4096, 14336) if t.stream_k]
    assert {t.stream_k for t in stream} == {1, 2}
    assert all(t.split_k == 1 for t in stream)
    assert all(t.block_n * t.block_k * t.num_stages <= 64 * 128 * 4 for t in stream)
    shapes = {(t.block_n, t.block_k, t.stream_k, t.num_stages) for t in stream}
    assert (64, 128, 1, 4) in shapes and (32, 128, 2, 4) in shapes  # the engine's two
    assert (128, 128, 1, 4) not in shapes  # 128 KiB of stages: no room for another tile
