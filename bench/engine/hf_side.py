"""The HF ``transformers`` side of ``bench.engine.throughput``: the same model through
``generate``, greedy, exactly ``new_tokens`` tokens per row (EOS masked by
``min_new_tokens``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from bench.engine.report import HFRun


def load_hf_model(folder: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    import transformers

    transformers.logging.set_verbosity_error()  # generation-config chatter, not results
    auto: Any = transformers.AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval()


@torch.inference_mode()
def run_hf(model: Any, prompts: list[list[int]], new_tokens: int) -> HFRun:
    """``generate`` with greedy decoding of exactly ``new_tokens`` tokens per row."""
    start = time.perf_counter()
    input_ids = torch.tensor(prompts, dtype=torch.long, device=model.device)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=model.config.eos_token_id,
    )
    seconds = time.perf_counter() - start
    return HFRun(seconds, output[:, input_ids.shape[1] :].tolist())
