"""Sliding-window attention (Mistral, windowed Qwen2 layers) matches transformers.

A window of 8 tokens on prompts up to 45 tokens long: most of what a token could see
lies outside its window, so full attention would give other tokens (checked: transformers
itself answers differently without the window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.kv_cache.sizing import plan_kv_cache
from dynask.actors.engine.model_config import ModelConfig
from tests.actors.engine.helpers import (
    hf_greedy,
    hf_model,
    make_engine,
    prompts_of_lengths,
    reference_dtype,
    without_eos,
)
from tests.conftest import TINY_SHAPE, _save_tiny_model

WINDOW = 8
LENGTHS = [3, 20, 45]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_mistral_folder(tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path) -> Path:
    from transformers import MistralConfig

    config = MistralConfig(**TINY_SHAPE, sliding_window=WINDOW, tie_word_embeddings=False)
    return _save_tiny_model(config, tokenizer_folder, tmp_path_factory.mktemp("tiny-mistral"))


@pytest.fixture(scope="module")
def tiny_windowed_qwen2_folder(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path
) -> Path:
    from transformers import Qwen2Config

    config = Qwen2Config(
        **TINY_SHAPE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    )  # layer 0 full, layer 1 windowed
    return _save_tiny_model(config, tokenizer_folder, tmp_path_factory.mktemp("tiny-qwen2-sw"))


def _tokens(engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    return [s.token_ids for s in engine.generate(prompts, GREEDY)]


@pytest.mark.parametrize("folder_fixture", ["tiny_mistral_folder", "tiny_windowed_qwen2_folder"])
def test_windowed_models_match_hf(folder_fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(folder_fixture)
    prompts = prompts_of_lengths(LENGTHS, seed=12)
    reference = hf_model(folder)
    expected = [hf_greedy(reference, p, GREEDY.max_tokens) for p in prompts]

    # Whole prompts; then chunks of 8 tokens (each chunk attends over cached blocks);
    # then the same prompts again in that engine, starting after their cached prefix.
    assert _tokens(make_engine(folder), prompts) == expected
    chunked = make_engine(folder, max_num_batched_tokens=8, block_size=4)
    assert _tokens(chunked, prompts) == expected
    assert _tokens(chunked, prompts) == expected
    assert chunked.stats().prefix_hit_tokens > 0

    # The test has teeth: the same weights with full attention give other tokens.
    full = _full_attention_reference(folder)
    assert [hf_greedy(full, p, GREEDY.max_tokens) for p in prompts] != expected


def _full_attention_reference(folder: Path) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    config.sliding_window = None
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"] * len(config.layer_types)
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=reference_dtype())
    return without_eos(model.eval())


def test_layer_windows_are_read_from_the_config() -> None:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    assert ModelConfig.from_hf(MistralConfig(**TINY_SHAPE, sliding_window=8)).layer_windows == (
        8,
        8,
    )
    assert ModelConfig.from_hf(MistralConfig(**TINY_SHAPE, sliding_window=None)).layer_windows == (
        None,
        None,
    )
    qwen = Qwen2Config(**TINY_SHAPE, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert ModelConfig.from_hf(qwen).layer_windows == (None, 8)
    assert ModelConfig.from_hf(Qwen2Config(**TINY_SHAPE)).layer_windows == (None, None)
    assert ModelConfig.from_hf(LlamaConfig(**TINY_SHAPE)).layer_windows == (None, None)


def test_a_window_does_not_cap_max_model_len_on_either_device() -> None:
    from transformers import MistralConfig

    model = ModelConfig.from_hf(MistralConfig(**TINY_SHAPE, sliding_window=64))
    config = EngineConfig(num_kv_blocks=100)  # sizing from the setting: no GPU needed

    on_gpu = plan_kv_cache(config, model, torch.device("cuda"), torch.bfloat16)
    on_cpu = plan_kv_cache(config, model, torch.device("cpu"), torch.float32)

    # The cache holds 1,600 tokens; the model allows TINY_SHAPE's positions.
    expected = min(100 * 16, TINY_SHAPE["max_position_embeddings"])
    assert on_gpu.max_model_len == on_cpu.max_model_len == expected > 64
