"""The Triton skinny matmul against ``F.linear`` (and SiLU·mul then ``F.linear``).

GPU only, or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32 only);
skipped otherwise. The chooser's rules are tested without a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dynask.actors.engine.cuda import fused_ops, skinny_matmul
from dynask.actors.engine.cuda.skinny_matmul import Tile
from tests.actors.engine.test_paged_kernels import _kernel_device


def _dtypes(device: torch.device) -> list[torch.dtype]:
    return [torch.float32] if device.type == "cpu" else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_matmul_matches_linear(rows: int, gated: bool, bias: bool) -> None:
    device = _kernel_device()
    n, k = 64, 256
    tile = Tile(16, 64) if rows == 1 else Tile(32, 128)
    for dtype in _dtypes(device):
        generator = torch.Generator().manual_seed(rows)
        x = torch.randn((rows, 2 * k if gated else k), generator=generator).to(device, dtype)
        weight = (torch.randn((n, k), generator=generator) / 16).to(device, dtype)
        b = torch.randn(n, generator=generator).to(device, dtype) if bias else None
        inputs = fused_ops.silu_and_mul(x.cpu()).to(device) if gated else x
        expected = F.linear(inputs.float(), weight.float(), None if b is None else b.float())
        got = skinny_matmul.launch(x, weight, b, tile, gated=gated)
        assert got.shape == (rows, n) and got.dtype == dtype
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(
            got.float().cpu(), expected.cpu(), atol=tolerance, rtol=tolerance
        )


def test_skinny_matmul_strided_rows_are_read_by_stride() -> None:
    device = _kernel_device()
    generator = torch.Generator().manual_seed(5)
    wide = torch.randn((4, 384), generator=generator).to(device)
    x = wide[:, :128]  # row stride 384, as a slice of a fused output would be
    weight = torch.randn((32, 128), generator=generator).to(device)
    got = skinny_matmul.launch(x, weight, None, Tile(16, 64))
    torch.testing.assert_close(got.cpu(), F.linear(x, weight).cpu(), atol=1e-4, rtol=1e-4)


def test_cpu_and_float32_keep_torch_ops() -> None:
    before = dict(skinny_matmul._choices)
    layer = nn.Linear(64, 32)
    x = torch.randn(2, 64)
    assert skinny_matmul._tile_for(x, layer, gated=False) is None
    assert torch.equal(skinny_matmul.linear(x, layer), layer(x))
    gate_up = torch.randn(2, 128)
    down = nn.Linear(64, 32)
    assert torch.equal(
        skinny_matmul.gated_linear(gate_up, down), down(fused_ops.silu_and_mul(gate_up))
    )
    assert skinny_matmul._choices == before  # nothing timed, nothing chosen


def test_tiles_fit_only_divisible_shapes() -> None:
    assert Tile(16, 512).fits(6144, 4096)
    assert Tile(16, 512).fits(4096, 14336)
    assert not Tile(32, 256).fits(48, 4096)
    assert not Tile(16, 512).fits(4096, 4000)


def test_chooser_keeps_cublas_unless_triton_wins_by_the_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cublas, triton_times = 10.0, iter([9.8, 9.6, 12.0])  # 9.8 > 0.97 * 10, 9.6 < 9.7
    timings = iter([cublas, *triton_times])
    monkeypatch.setattr(skinny_matmul, "_time", lambda run, device: next(timings))
    layer = nn.Linear(4096, 4096, bias=False)
    chosen = skinny_matmul._fastest(torch.zeros(1, 4096), layer, gated=False)
    assert chosen == skinny_matmul.ONE_ROW_TILES[1]
    timings = iter([10.0, 9.9, 9.8, 9.75])
    assert skinny_matmul._fastest(torch.zeros(1, 4096), layer, gated=False) is None
