"""Helpers for engine tests: building engines and the HF reference.

``DYNASK_TEST_DEVICE=cuda`` runs the engine tests on a GPU: engines and the HF reference
go there, in float32 unless ``DYNASK_TEST_DTYPE`` says otherwise, with a small fixed KV
cache so that many engines fit side by side. float32 because these tests assert greedy
output equal to HF token for token: in bfloat16 a fused GEMM (q|k|v, gate|up), another
cuBLAS kernel choice for another batch shape, or another reduction order in RMSNorm
rounds some activations one bf16 step apart, and random tiny models have near-tied
logits, so a few rows drift after some tokens (HF against itself at another batch size
does the same). bf16 is covered by the kernel tests, graph-vs-eager equality and the
benchmark's per-row first-divergence report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


TEST_DEVICE = os.environ.get("DYNASK_TEST_DEVICE", "cpu")
TEST_DTYPE = os.environ.get("DYNASK_TEST_DTYPE", "float32" if TEST_DEVICE != "cpu" else "auto")
GPU_TEST_KV_BLOCKS = 1024


def make_engine(folder: Path, **overrides: Any) -> LLMEngine:
    if TEST_DEVICE != "cpu":
        overrides.setdefault("num_kv_blocks", GPU_TEST_KV_BLOCKS)
    config = EngineConfig(model=str(folder), device=TEST_DEVICE, dtype=TEST_DTYPE, **overrides)
    return LLMEngine(config)


def reference_dtype() -> torch.dtype:
    config = EngineConfig(device=TEST_DEVICE, dtype=TEST_DTYPE)
    return config.torch_dtype(config.torch_device())


def hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=reference_dtype())
    return without_eos(model.to(TEST_DEVICE).eval())


def without_eos(model: Any) -> Any:
    """A reference that generates through EOS, as ``ignore_eos`` does (EOS stays possible)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate``."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
    )
    return [int(t) for t in out[0, len(prompt) :]]


def prompts_of_lengths(lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 40000, (n,), generator=generator).tolist() for n in lengths]
