"""GPU parts of ``bench/engine/throughput.py``: a random Llama-3.1-8B-shaped model, copy bandwidth,
the memory floor of a decode step, and prefill throughput.

The random model is built in memory with transformers' ``LlamaConfig`` and its own random
init, directly on the GPU in the benchmark's dtype (no checkpoint on disk: writing and
reading 16 GB would cost minutes of the device's time). Our engine takes its weights from
that same model (``build_engine_parts_from_hf``), so HF ``generate`` and our engine run
the very same weights in the same dtype.

The memory floor of a decode step is the bytes it must read from HBM — every weight
except the embedding table (only ``batch`` rows of it are read), plus the KV cache of
every row's context — over the device-to-device copy bandwidth measured in the same run
(bytes read plus bytes written per second, as ``nvidia-smi``-style copy tests count).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from bench.engine.floors import DecodeShape, prefill_flops

LLAMA_8B_SHAPE: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY_SHAPE: dict[str, Any] = {
    **LLAMA_8B_SHAPE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
RANDOM_MODELS = {"llama-8b": LLAMA_8B_SHAPE, "llama-tiny": TINY_SHAPE}


def build_random_llama(name: str, dtype: torch.dtype, device: torch.device) -> Any:
    """A randomly initialised HF ``LlamaForCausalLM`` of the named shape, on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**RANDOM_MODELS[name])
    config._attn_implementation = "sdpa"
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.generation_config.eos_token_id = None  # generate through EOS, like ignore_eos
    model.generation_config.pad_token_id = 0
    return model.eval()


def copy_bandwidth(device: torch.device, gib: float = 2.0, trials: int = 10) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    numel = int(gib * 2**30) // 4
    source = torch.empty(numel, dtype=torch.float32, device=device).uniform_()
    target = torch.empty_like(source)
    copy = partial(target.copy_, source)
    for _ in range(3):
        copy()
    times = [timed_seconds(device, copy) for _ in range(trials)]
    del source, target, copy
    torch.cuda.empty_cache()
    return float(2 * numel * 4 / statistics.median(times))


def timed_seconds(device: torch.device, run: Callable[[], object]) -> float:
    """Seconds ``run`` takes on ``device``: CUDA events around it on a GPU, the wall clock
    on a CPU (where the work is done when ``run`` returns)."""
    if device.type != "cuda":
        start_s = time.perf_counter()
        run()
        return time.perf_counter() - start_s
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end) / 1e3)


def matmul_rate(device: torch.device, n: int = 8192, trials: int = 10) -> float:
    """bf16 matrix-product rate in FLOP/s (n x n x n on random data, median of trials)."""
    a = torch.randn((n, n), dtype=torch.bfloat16, device=device)
    b = torch.randn((n, n), dtype=torch.bfloat16, device=device)
    for _ in range(3):
        torch.matmul(a, b)
    product = partial(torch.matmul, a, b)
    times = [timed_seconds(device, product) for _ in range(trials)]
    del a, b, product
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return float(2 * n**3 / statistics.median(times))


@dataclass(frozen=True)
class DecodeFloor:
    weight_bytes: int  # read per step (all weights but the embedding table)
    kv_bytes: int  # read per step at the mean context of the decode phase
    seconds: float  # (weights + KV) / copy bandwidth

    @property
    def tok_s_per_row(self) -> float:
        return 1.0 / self.seconds


def decode_floor(
    model: Any,
    kv_bytes_per_token: int,
    batch: int,
    mean_context: float,
    bandwidth: float,
) -> DecodeFloor:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.embed_tokens.weight  # type: ignore[union-attr]
    if model.lm_head.weight is not embedding:  # type: ignore[union-attr]
        weights -= embedding.numel() * embedding.element_size()
    kv = int(batch * mean_context * kv_bytes_per_token)
    return DecodeFloor(weights, kv, (weights + kv) / bandwidth)


def log_triton_compiles(started: float) -> None:
    """Prints every Triton compile with the time since ``started`` (finds stray compiles)."""
    from triton import knobs

    def hook(*, repr: str, already_compiled: bool = False, **_: Any) -> bool:
        if not already_compiled:
            print(f"[{time.perf_counter() - started:8.2f}s] triton compile {repr[:160]}")
        return False

    knobs.runtime.jit_cache_hook = hook


def gpu_facts(device: torch.device) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "gpu_name": props.name,
        "gpu_sms": props.multi_processor_count,
        "gpu_memory_gib": round(total / 2**30, 1),
        "gpu_free_gib_at_start": round(free / 2**30, 1),
        "cuda_version": torch.version.cuda,
    }


def measure_prefill(
    engine: Any,
    lengths: tuple[int, ...],
    make_prompt: Callable[[int, int], list[int]],
    params: Any,
    trials: int = 3,
) -> list[dict[str, float]]:
    """Prompt tokens/s of single fresh prompts (one sampled token each), median of trials.

    ``make_prompt(length, index)`` gives a distinct prompt per call, so no prefix is cached.
    """
    results = []
    for length in lengths:
        seconds = []
        for trial in range(trials + 1):  # the first is a warm-up for this length
            prompt = make_prompt(length, trial)
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.generate([prompt], params)
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds[1:])
        results.append({"prompt_len": length, "seconds": median, "tok_s": length / median})
    return results


def add_matmul_shares(
    results: list[dict[str, Any]], shape: DecodeShape, matmul_rate: float
) -> None:
    """Each ``measure_prefill`` row's model FLOPs (``floors.prefill_flops``: causal
    attention, one LM head row) per second, and that over the bf16 matrix rate measured in
    the same run (``matmul_rate``)."""
    for result in results:
        rate = prefill_flops(shape, result["prompt_len"]) / result["seconds"]
        result["model_tflop_s"] = rate / 1e12
        result["of_matmul_rate"] = rate / matmul_rate
