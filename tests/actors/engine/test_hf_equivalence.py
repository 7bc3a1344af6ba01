"""Greedy output equals transformers' greedy ``generate`` token for token.

Several prompts of different lengths are served concurrently in one engine, so this also
covers batching of decode rows with different context lengths and mixed prefill/decode
steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dynask.actors.api.sampling_params import SamplingParams
from tests.actors.engine.helpers import (
    hf_greedy,
    hf_model,
    make_engine,
    prompts_of_lengths,
    without_eos,
)

LENGTHS = [1, 7, 16, 33, 90]


@pytest.mark.parametrize("folder_fixture", ["tiny_llama_folder", "tiny_qwen3_folder"])
def test_tiny_models_match_hf(folder_fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(folder_fixture)
    engine = make_engine(folder)
    prompts = prompts_of_lengths(LENGTHS)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    reference = hf_model(folder)
    assert ours == [hf_greedy(reference, p, 20) for p in prompts]


def test_chunked_prefill_matches_hf(tiny_llama_folder: Path) -> None:
    # A 16-token budget splits every prompt into several chunks that share steps with
    # other sequences' decode tokens.
    engine = make_engine(tiny_llama_folder, max_num_batched_tokens=16)
    prompts = prompts_of_lengths([50, 23, 9], seed=1)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    reference = hf_model(tiny_llama_folder)
    assert ours == [hf_greedy(reference, p, 12) for p in prompts]


@pytest.mark.slow
def test_smollm2_gguf_matches_hf(smollm2_folder: Path) -> None:
    """The bundled GGUF, against transformers reading the very same GGUF file."""
    from transformers import AutoModelForCausalLM

    from dynask.actors.models.model_source import default_model_path

    engine = make_engine(smollm2_folder)
    chat = engine.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    prompts = [chat, *prompts_of_lengths([5, 40, 130], seed=2)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    gguf = default_model_path()
    reference = without_eos(
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    )
    assert ours == [hf_greedy(reference, p, 16) for p in prompts]
    assert engine.generate([chat], params)[0].text.startswith("The capital of France is Paris")
