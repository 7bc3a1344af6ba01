"""The short prefill graph's inputs and forward pass against the engine's own step.

The graph (``cuda.prefill_graph``) replays a cached prompt's last block from fixed-size
inputs: padded token rows, one tile, a full-width block table, keys split 16 ways. Here
those inputs run eagerly (no capture) on a CPU under Triton's interpreter
(``TRITON_INTERPRET=1``), so the padding, the tile and the sampled row are checked where
no GPU is; the capture and replay themselves are tested on CUDA (``test_cuda_graphs``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.cuda.prefill_graph import ShortPrefillInputs
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.model_runner import ModelRunner
from dynask.actors.engine.step_plan import StepPlan
from tests.actors.engine.helpers import prompts_of_lengths

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
    reason="needs TRITON_INTERPRET=1 with triton installed (the paged kernel on a CPU)",
)


@pytest.mark.parametrize("length", [40, 48, 20])
def test_padded_inputs_give_the_logits_of_the_eager_step(
    tiny_llama_folder: Path, length: int
) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_folder), device="cpu", num_kv_blocks=64))
    prompt = prompts_of_lengths([length], seed=11)[0]
    engine.generate([prompt], SamplingParams(max_tokens=1))  # its full blocks are cached now
    engine.add_request(prompt, SamplingParams(max_tokens=1))
    engine._drain_inbox()
    out = engine.scheduler.schedule()
    runner = engine.parts.runner
    assert isinstance(runner, ModelRunner)
    block_size = runner.spec.block_size
    plan = StepPlan.build(out.chunks, block_size)
    span = plan.prefills[0]
    assert span.num_cached == (length - 1) // block_size * block_size
    # A free block's first slot stands in for the scratch block the CUDA runner adds.
    used = {b.block_id for b in out.chunks[0].seq.blocks}
    scratch = next(b for b in range(64) if b not in used) * block_size
    config = runner.model.config
    inputs = ShortPrefillInputs(
        config.num_heads // config.num_kv_heads, scratch, 8, torch.device("cpu")
    )
    assert inputs.fits(plan, samples=True)
    assert not inputs.fits(plan, samples=False)

    with torch.inference_mode():
        expected = runner._logits(plan, [0], [0])
        inputs.fill(plan)
        got = inputs.forward(runner.model, runner.kv_caches)

    assert expected is not None
    assert inputs.max_tokens > span.num_new  # padded rows were in the batch
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert int(got.argmax()) == int(expected.argmax())
