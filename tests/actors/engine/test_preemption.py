"""Running out of KV blocks preempts by recompute, and the output does not change."""

from __future__ import annotations

from pathlib import Path

from dynask.actors.api.sampling_params import SamplingParams
from tests.actors.engine.helpers import hf_greedy, hf_model, make_engine, prompts_of_lengths


def test_preemption_under_tiny_block_budget_keeps_output(tiny_llama_folder: Path) -> None:
    # 12 blocks x 8 tokens = 96 slots; four sequences of ~30 + 24 tokens need ~220.
    engine = make_engine(tiny_llama_folder, block_size=8, num_kv_blocks=12)
    prompts = prompts_of_lengths([30, 25, 31, 20], seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    ours = [s.token_ids for s in engine.generate(prompts, params)]

    assert engine.stats().num_preemptions > 0
    reference = hf_model(tiny_llama_folder)
    assert ours == [hf_greedy(reference, p, 24) for p in prompts]
    stats = engine.stats()
    assert (stats.num_free_kv_blocks, stats.kv_usage) == (12, 0.0)


def test_max_model_len_is_clamped_to_the_cache(tiny_llama_folder: Path, caplog) -> None:
    with caplog.at_level("WARNING"):
        engine = make_engine(tiny_llama_folder, block_size=16, num_kv_blocks=4)

    assert engine.max_model_len == 64
    assert "max_model_len 512 does not fit the KV cache" in caplog.text
    assert "clamped to 64" in caplog.text
    # A sequence is cut at the context length with finish_reason "length".
    out = engine.generate(prompts_of_lengths([60]), SamplingParams(max_tokens=50, ignore_eos=True))
    assert (len(out[0].token_ids), out[0].finish_reason) == (4, "length")
