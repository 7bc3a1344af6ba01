"""The Triton skinny matmul against ``F.linear`` (and SiLU·mul then ``F.linear``).

GPU only, or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32 only);
skipped otherwise. The chooser's rules are tested without a GPU, and a tiny Llama with
the kernels forced matches HF token for token.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine import loader
from dynask.actors.engine.cuda import fused_ops, skinny_matmul
from dynask.actors.engine.cuda.skinny_matmul import Tile
from tests.actors.engine.helpers import (
    TEST_DEVICE,
    hf_greedy,
    hf_model,
    make_engine,
    prompts_of_lengths,
)
from tests.actors.engine.test_paged_kernels import _kernel_device


def _dtypes(device: torch.device) -> list[torch.dtype]:
    return [torch.float32] if device.type == "cpu" else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("split_k", [1, 2])
def test_skinny_matmul_matches_linear(rows: int, gated: bool, bias: bool, split_k: int) -> None:
    device = _kernel_device()
    n, k = 64, 256
    tile = Tile(16, 64, split_k=split_k) if rows == 1 else Tile(32, 128 // split_k, split_k=split_k)
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


@pytest.mark.parametrize("rows", [1, 4])
def test_split_k_sums_in_split_order_and_resets_its_counts(rows: int) -> None:
    """The last program of a column tile sums the partials in split order: the same bits
    every launch and as the float32 sum of the K quarters in that order; the counts are
    zero again after each launch, so the next (another shape too) is right."""
    device = _kernel_device()
    generator = torch.Generator().manual_seed(rows)
    n, k, split = 48, 512, 4
    x = torch.randn((rows, k), generator=generator).to(device)
    weight = torch.randn((n, k), generator=generator).to(device)
    tile = Tile(16, 64, split_k=split)
    first = skinny_matmul.launch(x, weight, None, tile)
    quarters = [
        F.linear(
            x[:, i * k // split : (i + 1) * k // split],
            weight[:, i * k // split : (i + 1) * k // split],
        )
        for i in range(split)
    ]
    in_order = quarters[0] + quarters[1] + quarters[2] + quarters[3]
    torch.testing.assert_close(first.cpu(), in_order.cpu(), atol=1e-3, rtol=1e-4)
    for _ in range(3):
        assert torch.equal(skinny_matmul.launch(x, weight, None, tile), first)
    part, count = skinny_matmul._splits[x.device]
    assert not count.any() and part.numel() >= split * n * (1 if rows == 1 else 16)
    other = torch.randn((2 * n, k), generator=generator).to(device)
    torch.testing.assert_close(
        skinny_matmul.launch(x, other, None, tile).cpu(),
        F.linear(x, other).cpu(),
        atol=1e-3,
        rtol=1e-4,
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
    assert torch.equal(skinny_matmul.linear(x, layer), layer(x))
    gate_up = torch.randn(2, 128)
    down = nn.Linear(64, 32)
    assert torch.equal(
        skinny_matmul.gated_linear(gate_up, down), down(fused_ops.silu_and_mul(gate_up))
    )
    residual, norm_weight = torch.randn(2, 64), torch.randn(64)
    normed, summed = fused_ops.add_rms_norm(x, residual, norm_weight, 1e-5)
    got, got_sum = skinny_matmul.norm_linear(x, residual, norm_weight, 1e-5, layer)
    assert torch.equal(got, layer(normed)) and torch.equal(got_sum, summed)
    assert skinny_matmul._choices == before  # nothing timed, nothing chosen


def test_tiles_fit_only_divisible_shapes() -> None:
    assert Tile(16, 512).fits(6144, 4096)
    assert Tile(16, 512).fits(4096, 14336)
    assert not Tile(32, 256).fits(48, 4096)
    assert not Tile(16, 512).fits(4096, 4000)
    assert Tile(8, 512, split_k=2).fits(4096, 14336)  # 14336 = 14 x (2 x 512)
    assert not Tile(8, 512, split_k=4).fits(4096, 5120)  # 5120 = 2.5 x (4 x 512)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("split_k", [1, 4])
def test_norm_prologue_matches_add_rms_norm_then_linear(
    rows: int, with_residual: bool, split_k: int
) -> None:
    """Split-K: each program normalises by the whole row's RMS and writes its own part of
    the new residual."""
    device = _kernel_device()
    k, n = 256, 64
    tile = Tile(16 if rows == 1 else 32, 64, split_k=split_k)
    for dtype in _dtypes(device):
        generator = torch.Generator().manual_seed(10 + rows)
        x = torch.randn((rows, k), generator=generator).to(dtype)
        residual = torch.randn((rows, k), generator=generator).to(dtype) if with_residual else None
        norm_weight = torch.randn(k, generator=generator).to(dtype)
        weight = (torch.randn((n, k), generator=generator) / 16).to(dtype)
        normed, want_sum = fused_ops.add_rms_norm(x, residual, norm_weight, 1e-5)  # torch ops
        expected = F.linear(normed.float(), weight.float())
        summed = None if residual is None else torch.empty_like(x).to(device)
        norm = skinny_matmul.Norm(
            norm_weight.to(device), 1e-5, None if residual is None else residual.to(device), summed
        )
        got = skinny_matmul.launch(x.to(device), weight.to(device), None, tile, norm=norm)
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float().cpu(), expected, atol=tolerance, rtol=tolerance)
        if summed is not None:
            torch.testing.assert_close(summed.cpu(), want_sum, atol=0, rtol=0)


def test_tiny_llama_with_every_projection_in_triton_matches_hf(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's wiring (residuals through the fused norms, the gated down projection):
    with the Triton kernels forced wherever the rows fit, greedy output still equals HF's
    (float32: the CPU under Triton's interpreter, or CUDA with DYNASK_TEST_DEVICE=cuda)."""
    if TEST_DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the engine runs on the CPU: needs TRITON_INTERPRET=1")
    _kernel_device()
    kinds: set[str] = set()

    def forced(x: torch.Tensor, layer: nn.Linear, kind: str, *_: object) -> Tile | None:
        if x.shape[0] > skinny_matmul.MAX_ROWS or not layer.weight.is_contiguous():
            return None
        kinds.add(kind)
        if kind in ("gated", "norm+residual"):  # split-K's wiring too
            return Tile(16, 16, split_k=2)
        return Tile(16, 32)  # divides every projection of the tiny shape

    monkeypatch.setattr(skinny_matmul, "_tile_for", forced)
    # A float32 engine on a CPU stores its weights column-major (faster MKL GEMVs): keep
    # them row-major here, as on CUDA, so that the kernels take them.
    monkeypatch.setattr(loader, "_column_major_projections", lambda model: None)
    engine = make_engine(tiny_llama_folder)
    # What EngineConfig.cuda_fast_paths does on CUDA (a CPU runner never calls it).
    engine.parts.runner.model.use_skinny_projections()
    prompts = prompts_of_lengths([3, 20, 41], seed=3)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    reference = hf_model(tiny_llama_folder)
    assert ours == [hf_greedy(reference, p, 6) for p in prompts]
    assert kinds == {"plain", "gated", "norm", "norm+residual"}


def test_row_buckets_are_the_decode_graphs_batch_sizes() -> None:
    from dynask.actors.engine.cuda.step import decode_buckets

    got = [skinny_matmul.row_bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 60, 64)]
    assert got == [1, 2, 4, 4, 8, 8, 16, 16, 24, 24, 32, 64, 64]
    graphs = [b for b in decode_buckets(256) if b <= skinny_matmul.MAX_ROWS]
    assert [skinny_matmul.row_bucket(b) for b in graphs] == graphs  # each graph its own bucket
    for rows in range(2, skinny_matmul.MAX_ROWS + 1):  # a bucket keeps its tl.dot variant
        assert skinny_matmul.dot_rows(skinny_matmul.row_bucket(rows)) == skinny_matmul.dot_rows(
            rows
        )
