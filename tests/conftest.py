"""Shared fixtures: tiny random Llama/Qwen3 models on disk and the bundled SmolLM2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import ast_parse_lock

ast_parse_lock.install()  # before any test starts a thread (CPython gh-106905)


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The bundled SmolLM2 GGUF, converted once into an HF folder."""
    from dynask.actors.models.model_source import resolve_model

    return resolve_model(None).folder


def _save_tiny_model(config: Any, tokenizer_folder: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    # Wider weights than the default init: logits far apart, so float rounding cannot
    # turn a greedy choice into a tie.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.25)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_folder).save_pretrained(out)
    return out


# The shape both tiny models share (the SmolLM2 vocabulary, so its tokenizer fits).
TINY_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def tokenizer_folder(request: pytest.FixtureRequest) -> Path:
    """SmolLM2's tokenizer: ``DYNASK_TEST_TOKENIZER`` (a folder), else the bundled model's.

    The folder lets the tiny-model tests run where the bundled GGUF is not installed
    (a GPU machine that only has the repository and a copy of the tokenizer files).
    """
    folder = os.environ.get("DYNASK_TEST_TOKENIZER")
    if folder:
        return Path(folder)
    smollm2: Path = request.getfixturevalue("smollm2_folder")
    return smollm2


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path) -> Path:
    from transformers import LlamaConfig

    config = LlamaConfig(**TINY_SHAPE, rope_theta=10000.0, tie_word_embeddings=False)
    return _save_tiny_model(config, tokenizer_folder, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen3_folder(tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path) -> Path:
    from transformers import Qwen3Config

    config = Qwen3Config(**TINY_SHAPE, head_dim=32, tie_word_embeddings=True)
    return _save_tiny_model(config, tokenizer_folder, tmp_path_factory.mktemp("tiny-qwen3"))
