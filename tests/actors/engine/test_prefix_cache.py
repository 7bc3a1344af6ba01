"""Prefix-cache hits skip recomputation and leave the output unchanged."""

from __future__ import annotations

from pathlib import Path

from dynask.actors.api.sampling_params import SamplingParams
from tests.actors.engine.helpers import make_engine, prompts_of_lengths

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def test_repeated_prompt_hits_cache_with_identical_output(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, block_size=16)
    prompt = prompts_of_lengths([100])[0]

    first = engine.generate([prompt], PARAMS)[0]
    steps_cold = engine.stats().num_steps
    second = engine.generate([prompt], PARAMS)[0]

    assert second.token_ids == first.token_ids
    assert first.usage is not None and first.usage.cached_tokens == 0
    # 100 tokens = 6 full blocks + 4; all 6 full blocks are reused (96 tokens).
    assert second.usage is not None and second.usage.cached_tokens == 96
    stats = engine.stats()
    assert (stats.prefix_queried_tokens, stats.prefix_hit_tokens) == (200, 96)
    assert stats.num_steps - steps_cold == 10  # 1 prefill step (4 tokens) + 9 decodes


def test_fully_cached_prompt_recomputes_last_block_only(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, block_size=16)
    prompt = prompts_of_lengths([64])[0]  # exactly 4 blocks

    first = engine.generate([prompt], PARAMS)[0]
    second = engine.generate([prompt], PARAMS)[0]

    assert second.token_ids == first.token_ids
    assert second.usage is not None and second.usage.cached_tokens == 48


def test_shared_prefix_across_different_prompts(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, block_size=16)
    shared = prompts_of_lengths([40], seed=3)[0]
    a, b = [*shared, 500, 501, 502], [*shared, 600, 601]
    alone = make_engine(tiny_llama_folder, block_size=16, enable_prefix_caching=False)

    engine.generate([a], PARAMS)
    hit = engine.generate([b], PARAMS)[0]

    assert hit.usage is not None and hit.usage.cached_tokens == 32
    assert hit.token_ids == alone.generate([b], PARAMS)[0].token_ids


def test_extra_keys_keep_caches_apart(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, block_size=16)
    prompt = prompts_of_lengths([50])[0]
    salted = SamplingParams(max_tokens=4, temperature=0.0, extra_keys=("salt-a",))

    engine.generate([prompt], PARAMS)
    other_salt = engine.generate([prompt], salted)[0]

    assert other_salt.usage is not None and other_salt.usage.cached_tokens == 0


def test_after_a_reset_the_prompt_is_recomputed_with_the_same_output(
    tiny_llama_folder: Path,
) -> None:
    engine = make_engine(tiny_llama_folder, block_size=16)
    prompt = prompts_of_lengths([100])[0]
    first = engine.generate([prompt], PARAMS)[0]

    assert engine.reset_prefix_cache()
    again = engine.generate([prompt], PARAMS)[0]

    assert again.token_ids == first.token_ids
    assert again.usage is not None and again.usage.cached_tokens == 0
