"""Issue 19 diagnosis: why the tiny Llama with its 17-64-row projections forced onto TMA
tiles (``tests/actors/engine/test_skinny_tma.py``'s engine test) leaves HF's tokens on a
GPU while it matches them under Triton's interpreter.

Runs that test's engine (float32, ``max_num_batched_tokens=48``, the same prompts) with
every TMA launch checked right after it runs: its output against ``x @ w^T`` in float64,
NaNs in its input and output, and the split-K arrival counts back at zero. Prints the
first launches that differ, then our greedy tokens beside HF's. ``DYNASK_PDL`` (0 or 1)
is read as the engine reads it, so running it twice separates PDL from the kernel.

    DYNASK_TEST_DEVICE=cuda python3 -m bench.engine.tma_check
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine import loader
from dynask.actors.engine.cuda import skinny_matmul, skinny_tma
from dynask.actors.engine.cuda.skinny_tma import TmaTile

# The tests' helpers, imported by name: mypy checks the package and bench/, not tests/.
helpers: Any = importlib.import_module("tests.actors.engine.helpers")
conftest: Any = importlib.import_module("tests.conftest")


def main() -> None:
    from transformers import LlamaConfig

    shape = dict(conftest.TINY_SHAPE, rope_theta=10000.0, tie_word_embeddings=False)
    config = LlamaConfig(**shape)  # as the tests' tiny_llama_folder
    folder = conftest._save_tiny_model(
        config, Path(os.environ["DYNASK_TEST_TOKENIZER"]), Path(tempfile.mkdtemp())
    )
    checks: list[dict[str, Any]] = []
    original = skinny_tma.launch

    def checked(x: torch.Tensor, weight: torch.Tensor, tile: TmaTile, part: Any, count: Any) -> Any:
        out = original(x, weight, tile, part, count)
        if x.is_cuda:
            torch.cuda.synchronize()
        expected = x.double() @ weight.double().T
        counts = count[: weight.shape[0] // tile.block_n] if tile.split_k > 1 else None
        checks.append({
            "rows": x.shape[0], "n": weight.shape[0], "k": x.shape[1],
            "max_diff": (out.double() - expected).abs().max().item(),
            "scale": expected.abs().max().item(),
            "nan_in": bool(x.isnan().any()), "nan_out": bool(out.isnan().any()),
            "counts_left": int(counts.count_nonzero()) if counts is not None else 0,
        })  # fmt: skip
        return out

    def forced(x: torch.Tensor, layer: nn.Linear, kind: str, *_: object) -> TmaTile | None:
        if not 16 < x.shape[0] <= skinny_tma.BLOCK_M or not layer.weight.is_contiguous():
            return None
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        return TmaTile(16, 16, split_k=2, num_stages=1)

    skinny_tma.launch = checked  # type: ignore[assignment]
    skinny_matmul._tile_for = forced  # type: ignore[assignment]
    loader._column_major_projections = lambda model: None  # type: ignore[assignment]
    engine = helpers.make_engine(folder, max_num_batched_tokens=48)
    model = engine.parts.runner.model
    model.use_skinny_projections()
    for module in model.modules():  # as the test: misaligned ones only
        if isinstance(module, nn.Linear) and module.weight.data_ptr() % 16:
            module.weight.data = module.weight.data.clone()
    prompts = helpers.prompts_of_lengths([20, 41, 30], seed=4)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ours = [s.token_ids for s in engine.generate(prompts, params)]
    reference = helpers.hf_model(folder)
    theirs = [helpers.hf_greedy(reference, p, 4) for p in prompts]
    print(f"DYNASK_PDL={os.environ.get('DYNASK_PDL', '1')}: {len(checks)} TMA launches")
    bad = [c for c in checks if c["max_diff"] > 1e-3 * max(c["scale"], 1.0) or c["nan_out"]]
    bad += [c for c in checks if c["counts_left"] and c not in bad]
    for number, check in enumerate(checks):
        if check in bad[:12]:
            print(f"  launch {number}: {check}")
    print(f"  {len(bad)} launches off; ours {ours}")
    print(f"  HF   {theirs}  equal: {ours == theirs}")


if __name__ == "__main__":
    main()
