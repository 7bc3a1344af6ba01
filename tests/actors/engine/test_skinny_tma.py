"""The TMA skinny GEMM (17..64 rows) against ``F.linear``, with the prologues the chooser
may put in front of it (SiLU·mul, add + RMSNorm), and wired into a model.

GPU (bf16 too), or Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, float32); the
layout rules run anywhere.
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
from dynask.actors.engine.cuda import fused_ops, skinny_matmul, skinny_tma
from dynask.actors.engine.cuda.skinny_tma import TmaTile
from tests.actors.engine.helpers import (
    TEST_DEVICE,
    hf_greedy,
    hf_model,
    make_engine,
    prompts_of_lengths,
)
from tests.actors.engine.test_paged_kernels import _kernel_device


@pytest.mark.parametrize(
    ("rows", "tile"),
    [
        (17, TmaTile(32, 64, split_k=1, num_stages=2)),  # rows past 17 read as zeros
        (64, TmaTile(32, 64, split_k=2, num_stages=2)),  # every row of the block
        (37, TmaTile(64, 32, split_k=4, num_stages=1)),
    ],
)
@pytest.mark.parametrize("prologue", ["plain", "gated", "norm"])
def test_tma_tile_matches_the_unfused_ops(rows: int, tile: TmaTile, prologue: str) -> None:
    device = _kernel_device()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    k, n = 256, 128
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, 2 * k if prologue == "gated" else k), generator=generator)
    residual = torch.randn((rows, k), generator=generator)
    norm_weight = torch.randn(k, generator=generator)
    weight = torch.randn((n, k), generator=generator) / 8
    x, residual, norm_weight, weight = (
        t.to(device, dtype) for t in (x, residual, norm_weight, weight)
    )
    norm = None
    if prologue == "gated":
        inp = fused_ops.silu_and_mul(x)
    elif prologue == "norm":
        inp = fused_ops.add_rms_norm(x, residual, norm_weight, 1e-5)[0]
        norm = skinny_matmul.Norm(norm_weight, 1e-5, residual, torch.empty_like(x))
    else:
        inp = x
    expected = F.linear(inp.float(), weight.float())
    got = skinny_matmul.launch(x, weight, None, tile, gated=prologue == "gated", norm=norm)
    assert got.shape == (rows, n) and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)
    # Split partials are summed in split order and the counts reset: the same bits again.
    again = skinny_matmul.launch(x, weight, None, tile, gated=prologue == "gated", norm=norm)
    assert torch.equal(again, got)


@pytest.mark.parametrize(
    ("rows", "tile", "sms", "n", "k"),
    [
        # 4 column tiles x 8 K blocks over 4 programs: each takes one tile whole
        (64, TmaTile(32, 32, num_stages=2, stream_k=1), 4, 128, 256),
        # 32 units over 12 programs: every tile shared by 3..4 programs, unevenly
        (37, TmaTile(32, 32, num_stages=2, stream_k=3), 4, 128, 256),
        # 16 units over 3 programs: a program's partial first tile, whole middle
        # tiles and partial last tile
        (17, TmaTile(16, 128, num_stages=1, stream_k=1), 3, 128, 256),
        # more programs than units: as many programs as units, one unit each
        (50, TmaTile(64, 64, num_stages=2, stream_k=4), 4, 128, 256),
    ],
)
def test_stream_k_tile_matches_f_linear_and_repeats_its_bits(
    rows: int, tile: TmaTile, sms: int, n: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = _kernel_device()
    if device.type == "cpu":
        monkeypatch.setattr(skinny_tma, "multiprocessors", lambda _device: sms)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn((rows, k), generator=generator).to(device, dtype)
    weight = (torch.randn((n, k), generator=generator) / 8).to(device, dtype)
    expected = F.linear(x.float(), weight.float())
    got = skinny_matmul.launch(x, weight, None, tile)
    assert got.shape == (rows, n) and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(skinny_matmul.launch(x, weight, None, tile), got)  # counts were reset


def test_stream_k_programs_and_partials_follow_the_units() -> None:
    cpu = torch.device("cpu")  # a nominal 4 SMs
    tile = TmaTile(64, 128, stream_k=2)
    assert tile.fits(6144, 4096) and not tile.fits(6144, 4096 + 64)
    assert tile.programs(6144, 4096, cpu) == 8  # 2 per SM
    assert tile.programs(64, 256, cpu) == 2  # never more than the 1 x 2 units
    assert tile.split_floats(6144, 4096, cpu) == 2 * 8 * 64 * 64  # two slots a program
    assert TmaTile(64, 128, split_k=2).split_floats(6144, 4096, cpu) == 2 * 64 * 6144
    assert TmaTile(64, 128).split_floats(6144, 4096, cpu) == 0
    assert str(tile) == "tma 64x128 stream2 w4 s4"


def test_a_tile_that_does_not_divide_the_weight_is_refused() -> None:
    part = torch.zeros(1)
    with pytest.raises(ValueError, match="does not fit"):
        skinny_tma.launch(
            torch.zeros((65, 128)), torch.zeros((64, 128)), TmaTile(32, 64), part, part
        )
    with pytest.raises(ValueError, match="does not fit"):
        skinny_tma.launch(torch.zeros((8, 96)), torch.zeros((64, 96)), TmaTile(32, 64), part, part)
    assert TmaTile(32, 64, split_k=2).fits(64, 128) and not TmaTile(32, 64, split_k=4).fits(64, 128)


def test_only_bias_free_half_precision_aligned_17_to_64_rows_are_offered() -> None:
    weight = torch.zeros((64, 128), dtype=torch.bfloat16)
    x = torch.zeros((64, 128), dtype=torch.bfloat16)
    assert skinny_tma.layout_fits(x, weight, None)
    assert skinny_tma.layout_fits(x[:17], weight, None)
    assert not skinny_tma.layout_fits(x[:16], weight, None)  # the 16-row kernels' range
    assert not skinny_tma.layout_fits(torch.zeros((65, 128), dtype=torch.bfloat16), weight, None)
    assert not skinny_tma.layout_fits(x, weight, torch.zeros(64, dtype=torch.bfloat16))
    assert not skinny_tma.layout_fits(x.float(), weight.float(), None)  # float32: HF tests
    assert not skinny_tma.layout_fits(
        torch.zeros((64, 129), dtype=torch.bfloat16)[:, 1:], weight, None
    )
    assert not skinny_tma.offered(x, weight, None)  # not on a CPU


def test_tiny_llama_with_tma_tiles_forced_matches_hf(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every 17..64-row projection on a TMA tile (and its prologue unfused: the
    norm's new residual must still reach the next layer), greedy output equals HF's."""
    if TEST_DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the engine runs on the CPU: needs TRITON_INTERPRET=1")
    _kernel_device()
    kinds: set[str] = set()

    def forced(x: torch.Tensor, layer: nn.Linear, kind: str, *_: object) -> TmaTile | None:
        if not 16 < x.shape[0] <= skinny_tma.BLOCK_M or not layer.weight.is_contiguous():
            return None
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return None  # as _tile_for: nothing new inside a capture (its split buffers)
        kinds.add(kind)
        return TmaTile(16, 16, split_k=2, num_stages=1)  # divides the tiny shapes

    monkeypatch.setattr(skinny_matmul, "_tile_for", forced)
    monkeypatch.setattr(loader, "_column_major_projections", lambda model: None)
    engine = make_engine(tiny_llama_folder, max_num_batched_tokens=48)  # steps of <= 48 rows
    engine.parts.runner.model.use_skinny_projections()
    # A CPU load may leave a weight 8 bytes off a descriptor's 16 (offered() refuses those):
    # such weights get an aligned copy. Only those: on CUDA the decode graphs were captured
    # at start-up and read the weights where they were (a copy of every weight freed the
    # originals under the graphs, whose replays then read reused memory: NaN logits).
    for module in engine.parts.runner.model.modules():
        if isinstance(module, nn.Linear) and module.weight.data_ptr() % 16:
            module.weight.data = module.weight.data.clone()
    prompts = prompts_of_lengths([20, 41, 30], seed=4)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    reference = hf_model(tiny_llama_folder)
    assert ours == [hf_greedy(reference, p, 4) for p in prompts]
    assert kinds == {"plain", "gated", "norm", "norm+residual"}
