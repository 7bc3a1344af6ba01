"""The TMA skinny GEMM sweep's tile list (``bench.engine.skinny_tma``)."""

from __future__ import annotations

from bench.engine import skinny_tma


def test_the_sweep_offers_only_tiles_that_divide_the_weight() -> None:
    tiles = skinny_tma.tma_tiles(4096, 14336)  # Llama-3.1-8B's down projection
    assert tiles and all(t.fits(4096, 14336) for t in tiles)
    assert all(96 <= 4096 // t.block_n * t.split_k <= 1056 for t in tiles)
    shapes = {(t.block_n, t.block_k, t.split_k) for t in tiles}
    assert (32, 64, 8) in shapes and (128, 128, 8) in shapes
    assert (128, 64, 1) not in shapes  # 32 programs: a quarter of the SMs
