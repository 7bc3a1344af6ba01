"""The experimental TMA skinny GEMM of ``bench.engine.skinny_tma`` against ``F.linear``.

GPU (bf16), or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.engine import skinny_tma
from bench.engine.skinny_tma import TmaTile
from tests.actors.engine.test_paged_kernels import _kernel_device


@pytest.mark.parametrize(
    ("rows", "tile"),
    [
        (1, TmaTile(32, 64, split_k=1, num_stages=2)),
        (64, TmaTile(32, 64, split_k=2, num_stages=2)),  # every row of the block
        (37, TmaTile(64, 32, split_k=4, num_stages=1)),  # rows past 37 read as zeros
    ],
)
def test_skinny_tma_equals_linear_split_or_not(rows: int, tile: TmaTile) -> None:
    device = _kernel_device()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, 256), generator=generator).to(device, dtype)
    weight = (torch.randn((128, 256), generator=generator) / 8).to(device, dtype)
    got = skinny_tma.launch(x, weight, tile)
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    expected = F.linear(x.float(), weight.float())
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)
    # The split partials are summed in split order, and the counts reset: same bits again.
    assert torch.equal(skinny_tma.launch(x, weight, tile), got)


def test_the_sweep_offers_only_tiles_that_divide_the_weight() -> None:
    tiles = skinny_tma.tma_tiles(4096, 14336)  # Llama-3.1-8B's down projection
    assert tiles and all(t.fits(4096, 14336) for t in tiles)
    assert all(96 <= 4096 // t.block_n * t.split_k <= 1056 for t in tiles)
    shapes = {(t.block_n, t.block_k, t.split_k) for t in tiles}
    assert (32, 64, 8) in shapes and (128, 128, 8) in shapes
    assert (128, 64, 1) not in shapes  # 32 programs: a quarter of the SMs
    with pytest.raises(ValueError, match="does not fit"):
        skinny_tma.launch(torch.zeros((65, 128)), torch.zeros((64, 128)), TmaTile(32, 64))
