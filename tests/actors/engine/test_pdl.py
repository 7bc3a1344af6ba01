"""Programmatic dependent launch (``cuda.pdl``): when the kernels take it, and that it
changes no token (the kernels wait where they must: a missing wait is a race that shows
as different logits on a Hopper GPU, where the tiny model's kernels are microseconds
long and overlap as much as they ever will)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.cuda import pdl, skinny_matmul
from dynask.actors.engine.cuda.skinny_matmul import Tile
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import prompts_of_lengths


def test_no_pdl_off_cuda_or_under_the_interpreter_or_when_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert pdl.options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.options(torch.device("cuda", 0)) == {"PDL": False}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("DYNASK_PDL", "0")
    assert pdl.options(torch.device("cuda", 0)) == {"PDL": False}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pdl_is_taken_on_hopper_and_later_only() -> None:
    hopper = torch.cuda.get_device_capability(0)[0] >= 9
    expected = {"PDL": True, "launch_pdl": True} if hopper else {"PDL": False}
    assert pdl.options(torch.device("cuda", 0)) == expected
    assert pdl.options(torch.device("cuda")) == expected


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability(0)[0] < 9,
    reason="needs a CUDA GPU of compute capability 9.0 or later (PDL)",
)
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_pdl_changes_no_token(
    tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch, cuda_graphs: bool
) -> None:
    def forced(x: torch.Tensor, layer: nn.Linear, kind: str, *_: object) -> Tile | None:
        # Every projection in the Triton kernels (which wait for the kernel before them),
        # split-K's too: the tiny shapes are below the chooser's tiles.
        if x.shape[0] > skinny_matmul.MAX_ROWS:
            return None
        return Tile(16, 16, split_k=2) if kind == "gated" else Tile(16, 32)

    monkeypatch.setattr(skinny_matmul, "_tile_for", forced)
    prompts = prompts_of_lengths([3, 17, 40, 64, 9], seed=11)
    runs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("DYNASK_PDL", flag)
        config = EngineConfig(
            model=str(tiny_llama_folder), device="cuda", num_kv_blocks=256, max_num_seqs=16,
            cuda_graphs=cuda_graphs, dtype="bfloat16",
        )  # fmt: skip
        engine = LLMEngine(config)
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
        outputs = engine.generate(prompts, params)
        runs.append([(o.token_ids, o.logprobs) for o in outputs])
    assert runs[0] == runs[1]
    assert [len(tokens) for tokens, _ in runs[0]] == [24] * 5
