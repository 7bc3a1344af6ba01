"""Engine configuration errors name the field and the bad value."""

from __future__ import annotations

import pytest

from dynask.actors.engine.config import EngineConfig


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("block_size", 0, "EngineConfig 'block_size' has value 0; expected an integer >= 1"),
        ("kv_cache_gib", -1.0, "EngineConfig 'kv_cache_gib' has value -1.0; expected a number > 0"),
        ("dtype", "fp8", "EngineConfig 'dtype' has value 'fp8'; expected one of auto, float32"),
        ("device", "tpu", "EngineConfig 'device' has value 'tpu'; expected auto, cpu, cuda"),
        ("max_model_len", 1, "EngineConfig 'max_model_len' has value 1; expected an integer >= 2"),
        (
            "prefix_cache_protected_share",
            1.5,
            "EngineConfig 'prefix_cache_protected_share' has value 1.5; expected a number in",
        ),
    ],
)
def test_bad_values_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_the_protected_share_defaults_to_the_pools() -> None:
    from dynask.actors.backends.mocker_config import MockerConfig
    from dynask.kv.block_pool import DEFAULT_PROTECTED_SHARE

    assert EngineConfig().prefix_cache_protected_share == DEFAULT_PROTECTED_SHARE
    assert MockerConfig().prefix_cache_protected_share == DEFAULT_PROTECTED_SHARE


def test_cuda_requested_without_a_gpu_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU is available here"):
        EngineConfig(device="cuda").torch_device()


def test_defaults_are_float32_on_cpu() -> None:
    import torch

    config = EngineConfig(device="cpu")
    assert config.torch_dtype(config.torch_device()) == torch.float32
