"""``out=vllm`` arguments: checked where the deployment is made, with the field named."""

from __future__ import annotations

import logging

import pytest

from dynask.actors.backends.vllm.args import VLLMArgs
from dynask.actors.runtime.engine_factory import EngineSpec


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"gpu_memory_utilization": 1.5}, "'gpu_memory_utilization' has value 1.5"),
        ({"dtype": "float8"}, "'dtype' has value 'float8'; expected one of auto, float32"),
        ({"tensor_parallel_size": 0}, "'tensor_parallel_size' has value 0; expected an int >= 1"),
        ({"kv_cache_gib": 0}, "'kv_cache_gib' has value 0; expected a number of GiB > 0"),
        ({"max_model_len": 1}, "'max_model_len' has value 1; expected an int >= 2"),
        ({"max_model_length": 4096}, "'max_model_length' is not known to out=vllm; known: "),
        ({"enforce_eager": "yes"}, "'enforce_eager' of out=vllm has value 'yes' of type str"),
    ],
)
def test_a_wrong_engine_argument_fails_when_the_spec_is_made(
    args: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        EngineSpec(kind="vllm", engine_args=args)
    assert message in str(error.value)


def test_cpu_defaults_are_float32_eager_and_a_small_kv_cache() -> None:
    kwargs = VLLMArgs(max_model_len=4096, max_num_seqs=8).engine_kwargs("/m", on_cpu=True)

    assert kwargs == {
        "model": "/m",
        "tokenizer": "/m",
        "max_model_len": -1,  # vLLM auto-fits; 4096 is applied on top
        "dtype": "float32",
        "tensor_parallel_size": 1,
        "enable_prefix_caching": True,
        "seed": 0,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 2**30,
        "max_num_seqs": 8,
    }


def test_gpu_keeps_vllms_defaults_unless_asked() -> None:
    args = VLLMArgs(dtype="bfloat16", gpu_memory_utilization=0.5, tokenizer="/tok")
    kwargs = args.engine_kwargs("/m", on_cpu=False)

    assert kwargs["dtype"] == "bfloat16"
    assert kwargs["gpu_memory_utilization"] == 0.5
    assert kwargs["enforce_eager"] is False
    assert kwargs["tokenizer"] == "/tok"
    assert "kv_cache_memory_bytes" not in kwargs


def test_a_max_model_len_that_does_not_fit_is_clamped_with_a_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="dynask.actors.backends.vllm.args"):
        assert VLLMArgs(max_model_len=100_000).effective_max_model_len(5792) == 5792
    assert "max_model_len 100000 does not fit this engine" in caplog.text
    assert "serving max_model_len=5792" in caplog.text

    assert VLLMArgs(max_model_len=2048).effective_max_model_len(5792) == 2048
    assert VLLMArgs().effective_max_model_len(5792) == 5792
