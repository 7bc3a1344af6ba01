"""The fused gate|up GEMM with SiLU·mul in its epilogue against the unfused ops.

GPU (bf16), or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32); the
eligibility rules run anywhere.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dynask.actors.engine.cuda import fused_ops, gated_gemm
from dynask.actors.engine.cuda.gated_gemm import GatedTile
from tests.actors.engine.test_paged_kernels import _kernel_device


@pytest.mark.parametrize(
    ("rows", "tile"),
    [
        (1, GatedTile(16, 16, 32, num_warps=4, num_stages=1, group_m=2)),
        (70, GatedTile(16, 16, 32, num_warps=4, num_stages=1, group_m=2)),  # 5 row tiles
        (37, GatedTile(32, 32, 64, num_warps=4, num_stages=2, group_m=8)),
    ],
)
@pytest.mark.parametrize("programs", [0, 3])  # one per SM (or per tile); 3 walking them
def test_gated_gemm_equals_linear_then_silu_and_mul(
    rows: int, tile: GatedTile, programs: int
) -> None:
    device = _kernel_device()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    n, k = 64, 128
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, k), generator=generator).to(device, dtype)
    weight = (torch.randn((2 * n, k), generator=generator) / 8).to(device, dtype)
    gate_up = F.linear(x.float(), weight.float())
    expected = F.silu(gate_up[:, :n]) * gate_up[:, n:]
    got = gated_gemm.launch(x, weight, tile, programs or 1 << 30)
    assert got.shape == (rows, n) and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float().cpu(), expected.cpu(), atol=tolerance, rtol=tolerance)
    if dtype != torch.float32:  # rounded where the unfused ops round: within a bf16 ulp
        unfused = fused_ops.silu_and_mul(F.linear(x, weight))
        torch.testing.assert_close(got, unfused, atol=2e-2, rtol=1.6e-2)


def test_a_tile_that_does_not_divide_the_weight_is_refused() -> None:
    x = torch.zeros((4, 96))
    weight = torch.zeros((2 * 64, 96))
    with pytest.raises(ValueError, match="does not fit"):
        gated_gemm.launch(x, weight, GatedTile(16, 16, 64))  # 96 % 64 != 0
    assert GatedTile(16, 32, 32).fits(64, 96) and not GatedTile(16, 48, 32).fits(64, 96)


def test_only_bias_free_half_precision_cuda_layers_are_eligible() -> None:
    def linear(k: int, bias: bool = False) -> nn.Linear:
        return nn.Linear(k, 64, bias=bias, device="meta", dtype=torch.bfloat16)

    x = torch.empty((8, 32), dtype=torch.bfloat16, device="meta")
    assert gated_gemm.layout_fits(x, linear(32))
    assert not gated_gemm.layout_fits(x.float(), linear(32))
    assert not gated_gemm.layout_fits(x, linear(32, bias=True))
    assert not gated_gemm.layout_fits(x.t(), linear(8))  # rows not contiguous
    assert not gated_gemm.eligible(x, linear(32))  # not on a CUDA device


def test_row_buckets_are_the_next_power_of_two() -> None:
    assert [gated_gemm.row_bucket(r) for r in (1, 2, 3, 128, 129, 256, 5000, 8192)] == [
        1, 2, 4, 128, 256, 256, 8192, 8192,
    ]  # fmt: skip


def test_start_up_decides_every_bucket_up_to_the_step_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed: list[torch.Size] = []
    monkeypatch.setattr(gated_gemm, "tile_for", lambda x, layer: timed.append(x.shape))
    layer = nn.Linear(32, 64, bias=False)
    gated_gemm.decide(layer, 2000)
    assert timed == [(64, 32), (128, 32), (256, 32), (512, 32), (1024, 32), (2048, 32)]
    timed.clear()
    gated_gemm.decide(layer, 40)  # 33-64 rows: one bucket
    assert timed == [(64, 32)]
    timed.clear()
    gated_gemm.decide(layer, 32)  # below MIN_ROWS: nothing to decide
    assert timed == []


def test_the_64_row_bucket_offers_the_small_tiles_and_larger_ones_the_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offered: dict[int, list[GatedTile]] = {}

    def fastest(tiles: list[GatedTile], *args: object) -> None:
        offered[rows] = list(tiles)

    monkeypatch.setattr(gated_gemm.kernel_chooser, "fastest", fastest)
    monkeypatch.setattr(gated_gemm.kernel_chooser, "cold_copies", lambda weight: [weight])
    monkeypatch.setattr(gated_gemm, "eligible", lambda x, layer: True)
    monkeypatch.setattr(gated_gemm, "_choices", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    layer = nn.Linear(4096, 2 * 14336, bias=False, device="meta", dtype=torch.bfloat16)
    for rows in (32, 33, 64, 65, 256):
        gated_gemm.tile_for(torch.empty((rows, 4096), device="meta", dtype=torch.bfloat16), layer)
    assert offered == {
        33: list(gated_gemm.SMALL_CANDIDATES),  # 64 rows then share 33's choice
        65: list(gated_gemm.CANDIDATES),
        256: list(gated_gemm.CANDIDATES),
    }
    assert all(not t.persistent and t.block_m == 64 for t in gated_gemm.SMALL_CANDIDATES)


def test_a_grid_tile_runs_one_program_per_output_tile() -> None:
    device = _kernel_device()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    tile = GatedTile(16, 16, 32, num_warps=4, num_stages=1, group_m=2, persistent=False)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn((40, 128), generator=generator).to(device, dtype)
    weight = (torch.randn((128, 128), generator=generator) / 8).to(device, dtype)
    gate_up = F.linear(x.float(), weight.float())
    expected = F.silu(gate_up[:, :64]) * gate_up[:, 64:]
    got = gated_gemm.launch(x, weight, tile)  # programs=0: 3 x 4 tiles, no SM count asked
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float().cpu(), expected.cpu(), atol=tolerance, rtol=tolerance)
    assert str(tile) == "16x16x32 w4 s1 g2 grid"


def test_few_rows_or_a_cpu_never_time_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("timed")

    monkeypatch.setattr(gated_gemm.kernel_chooser, "fastest", fail)
    layer = nn.Linear(32, 64, bias=False).to(torch.bfloat16)
    assert gated_gemm.tile_for(torch.zeros((4096, 32), dtype=torch.bfloat16), layer) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused path runs on CUDA")
@pytest.mark.parametrize("rows", [300, 48])  # 48: the down projection through the skinny path
def test_the_mlp_takes_the_fused_gemm_where_it_was_chosen(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    from dynask.actors.engine.model import MLP, RMSNorm

    shape = SimpleNamespace(hidden_size=256, intermediate_size=512, mlp_bias=False)
    torch.manual_seed(0)
    mlp = MLP(cast(Any, shape)).to("cuda", torch.bfloat16)
    norm = RMSNorm(256, 1e-6).to("cuda", torch.bfloat16)
    x = torch.randn((rows, 256), device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    monkeypatch.setattr(gated_gemm, "tile_for", lambda x, layer: None)
    unfused, unfused_res = mlp.fast_forward(x, residual, norm)
    tile = GatedTile(64, 32, 32, num_warps=4, num_stages=2)
    monkeypatch.setattr(gated_gemm, "tile_for", lambda x, layer: tile)
    fused, fused_res = mlp.fast_forward(x, residual, norm)
    assert torch.equal(fused_res, unfused_res)
    torch.testing.assert_close(fused, unfused, atol=2e-2, rtol=2e-2)
