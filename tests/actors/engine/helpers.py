"""Helpers for engine tests: building engines and the HF reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def make_engine(folder: Path, **overrides: Any) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), device="cpu", **overrides))


def hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return without_eos(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())


def without_eos(model: Any) -> Any:
    """A reference that generates through EOS, as ``ignore_eos`` does (EOS stays possible)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate``."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
    )
    return [int(t) for t in out[0, len(prompt) :]]


def prompts_of_lengths(lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 40000, (n,), generator=generator).tolist() for n in lengths]
