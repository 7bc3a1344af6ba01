"""The whole-stack GPU benchmark's random model speaks only ids its tokenizer knows.

Llama-3.1's 128,256 ids against SmolLM2's 49,152-token tokenizer made ~60% of a random
model's tokens unspellable: deltas without text, held by the control plane until a later
delta has text, so the benchmark measured bursts instead of streaming (H200, 2026-12-01).
Here the same saving code runs on a CPU with the tiny shape."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.serving.gpu_stack import MARKER, save_random_model


def test_the_saved_random_model_picks_only_ids_the_tokenizer_knows(
    tmp_path: Path, tokenizer_folder: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "model"
    save_random_model(folder, tokenizer_folder, "llama-tiny", device="cpu")
    vocabulary = len(AutoTokenizer.from_pretrained(tokenizer_folder))
    assert json.loads((folder / MARKER).read_text()) == {
        "shape": "llama-tiny",
        "ids_in_vocabulary": vocabulary,
    }
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == 128256 > vocabulary  # the shape is Llama-3.1's
    head = model.get_output_embeddings().weight
    assert bool((head[vocabulary:] == 0).all()) and bool((head[:vocabulary] != 0).any())
    ids = torch.randint(0, 128256, (4, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        picked = model(ids).logits.argmax(dim=-1)
    assert int(picked.max()) < vocabulary  # every position, every row
    save_random_model(folder, tokenizer_folder, "llama-tiny", device="cpu")  # kept: no redo
