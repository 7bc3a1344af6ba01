"""Per-request behaviour: seeds, stop strings and tokens, abort, bad input, the thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.models.model_source import ModelNotFoundError
from tests.actors.engine.helpers import make_engine, prompts_of_lengths


@pytest.fixture(scope="module")
def engine(tiny_llama_folder: Path) -> LLMEngine:
    return make_engine(tiny_llama_folder, block_size=8)


def test_seed_reproduces_sampled_output(engine: LLMEngine) -> None:
    prompt = prompts_of_lengths([12])[0]
    params = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, top_k=50, seed=1234)

    first = engine.generate([prompt], params)[0].token_ids
    # Same seed in a batch with other requests: still the same tokens.
    batch = engine.generate([prompts_of_lengths([30], seed=9)[0], prompt], params)
    other_seed = engine.generate([prompt], SamplingParams(max_tokens=20, seed=99))[0].token_ids

    assert batch[1].token_ids == first
    assert other_seed != first


def test_stop_string_truncates_text_and_never_streams_it(engine: LLMEngine) -> None:
    prompt = prompts_of_lengths([10], seed=5)[0]
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full_text = engine.generate([prompt], greedy)[0].text
    start = next(
        i for i in range(8, len(full_text) - 4) if full_text[i : i + 4] not in full_text[: i + 3]
    )
    stop = full_text[start : start + 4]

    stopped = engine.generate([prompt], SamplingParams(**{**greedy.__dict__, "stop": (stop,)}))[0]

    assert stopped.text == full_text[: full_text.index(stop)]
    assert stopped.finish_reason == "stop"
    assert all(stop not in d.text for d in stopped.received)


def test_stop_token_ids_end_the_request(engine: LLMEngine) -> None:
    prompt = prompts_of_lengths([10], seed=6)[0]
    tokens = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0))[0].token_ids
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(tokens[3],))

    stopped = engine.generate([prompt], params)[0]

    assert stopped.token_ids == tokens[: tokens.index(tokens[3]) + 1]
    assert stopped.finish_reason == "stop"
    assert stopped.received[-1].stop_reason == tokens[3]


def test_abort_frees_every_block(engine: LLMEngine) -> None:
    pool = engine.parts.kv_manager.pool
    free_before = pool.num_free_blocks
    stream = engine.add_request(prompts_of_lengths([40])[0], SamplingParams(max_tokens=200))
    for _ in range(4):
        engine.step()
    assert pool.num_free_blocks < free_before

    engine.abort(stream.request_id)
    engine.step()

    assert stream.finish_reason == "abort"
    assert (pool.num_free_blocks, pool.usage) == (free_before, 0.0)
    assert engine.stats().num_running == 0


def test_usage_counts_prompt_and_completion(engine: LLMEngine) -> None:
    out = engine.generate(prompts_of_lengths([13]), SamplingParams(max_tokens=7, ignore_eos=True))
    assert out[0].usage is not None
    assert (out[0].usage.prompt_tokens, out[0].usage.completion_tokens) == (13, 7)
    assert out[0].finish_reason == "length"


def test_prompt_longer_than_context_is_refused(engine: LLMEngine) -> None:
    with pytest.raises(
        ValueError, match="the prompt has 600 tokens, but this engine's context is 512"
    ):
        engine.add_request(prompts_of_lengths([600])[0])


def test_out_of_vocabulary_token_is_refused(engine: LLMEngine) -> None:
    with pytest.raises(
        ValueError, match=r"prompt token id 49152 is outside the vocabulary \[0, 49152\)"
    ):
        engine.add_request([5, 49152])


def test_bad_sampling_params_name_the_field() -> None:
    with pytest.raises(ValueError, match="SamplingParams 'top_p' has value 1.5"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="SamplingParams 'max_tokens' has value 0"):
        SamplingParams(max_tokens=0)


def test_bad_model_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match=f"model path '{missing}' does not exist"):
        LLMEngine(EngineConfig(model=str(missing)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        LLMEngine(EngineConfig(model=str(tmp_path / "empty")))


def test_engine_thread_serves_concurrent_submitters(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = prompts_of_lengths([5, 9, 14, 20], seed=7)
    expected = [s.token_ids for s in engine.generate(prompts, params)]
    results: dict[int, list[int]] = {}
    seen_per_step: list[int] = []
    engine.add_output_listener(lambda outputs: seen_per_step.append(len(outputs)))

    def submit(index: int) -> None:
        stream = engine.add_request(prompts[index], params)
        results[index] = [t for out in stream for t in out.token_ids]

    engine.start()
    try:
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        engine.shutdown()

    assert [results[i] for i in range(len(prompts))] == expected
    assert sum(seen_per_step) == 4 * 8  # one delta per token, delivered once per step
