"""One engine's GPU share: weights + activation peak + KV cache <= fraction x total.

No GPU here: the device's memory readings are given as numbers (``DeviceMemory``), the
way ``read_device_memory`` returns them on a GPU. Issue 20: two engines at 0.45 on one
device failed because the second one was charged for the first one's memory.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.kv_cache.sizing import (
    DeviceMemory,
    activation_peak_bytes,
    gpu_kv_budget,
)
from dynask.actors.engine.model_config import ModelConfig

GIB = 2**30
ACTIVATIONS = 2 * GIB


def llama_8b_shape() -> ModelConfig:
    return ModelConfig.from_hf(
        LlamaConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
        )
    )


def test_the_activation_peak_is_computed_from_the_shape_and_the_step_budget() -> None:
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64)
    # per token: 4 x 4096 + (32 + 2 x 8) x 128 + 3 x 14336 = 65,536 bf16 values;
    # logits: 2 x 64 rows x 128,256 x 4 bytes.
    expected = 2048 * 65536 * 2 + 2 * 64 * 128256 * 4
    assert activation_peak_bytes(config, llama_8b_shape(), torch.bfloat16) == expected == 334102528


def test_two_engines_on_one_gpu_are_each_charged_their_own_usage() -> None:
    # 100 GiB device; each engine's weights take 16 GiB; a CUDA context 0.5 GiB.
    first = DeviceMemory(total=100 * GIB, free=int(83.5 * GIB), own=16 * GIB)
    budget = gpu_kv_budget(0.45, first, ACTIVATIONS)
    assert budget.kv_bytes == 45 * GIB - 16 * GIB - ACTIVATIONS == 27 * GIB

    # The first engine now holds 16 + 27 + 2 GiB (+ context); the second loads its weights.
    second = DeviceMemory(
        total=100 * GIB, free=int(38 * GIB), own=16 * GIB, others=("pid 101: 45.5 GiB",)
    )
    assert gpu_kv_budget(0.45, second, ACTIVATIONS).kv_bytes == 27 * GIB
    assert budget.source == (
        "45% of 100.0 GiB = 45.00 GiB, minus this engine's weights 16.00 GiB and activation "
        "peak 2.00 GiB = 27.00 GiB"
    )


def test_a_share_larger_than_the_free_memory_is_refused_naming_the_other_processes() -> None:
    third = DeviceMemory(
        total=100 * GIB,
        free=int(3.5 * GIB),
        own=5 * GIB,
        others=("pid 101: 45.5 GiB", "pid 102: 45.5 GiB"),
    )
    with pytest.raises(ValueError) as refused:
        gpu_kv_budget(0.2, third, ACTIVATIONS)
    assert str(refused.value) == (
        "this engine's KV cache needs 13.00 GiB (20% of 100.0 GiB = 20.00 GiB, minus this "
        "engine's weights 5.00 GiB and activation peak 2.00 GiB = 13.00 GiB) but only 1.50 GiB "
        "of the device are free after its activation peak: 91.50 GiB are held by others "
        "(pid 101: 45.5 GiB; pid 102: 45.5 GiB). Lower gpu_memory_utilization so that the "
        "engines on this GPU add up to at most 1"
    )


def test_a_share_too_small_for_the_weights_is_refused() -> None:
    memory = DeviceMemory(total=100 * GIB, free=80 * GIB, own=16 * GIB)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 0.15 leaves no room"):
        gpu_kv_budget(0.15, memory, ACTIVATIONS)
