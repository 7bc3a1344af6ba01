"""Logprobs, penalties, logit_bias and min_tokens in the built-in engine.

Each feature is checked against a reference computed here from transformers' own logits
(the tiny random Llama, whose logits are far apart), token for token.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import hf_model, make_engine, prompts_of_lengths

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def engine(tiny_llama_folder: Path) -> LLMEngine:
    return make_engine(tiny_llama_folder)


@pytest.fixture(scope="module")
def reference(tiny_llama_folder: Path) -> Any:
    return hf_model(tiny_llama_folder)


def hf_logits(model: Any, tokens: list[int]) -> torch.Tensor:
    """transformers' logits for the next token after ``tokens`` (float32)."""
    with torch.no_grad():
        ids = torch.tensor([tokens], device=model.device)
        return model(ids).logits[0, -1].float().cpu()


def reference_greedy(
    model: Any, prompt: list[int], params: SamplingParams, eos: tuple[int, ...] = ()
) -> list[int]:
    """Greedy decoding with the processing written out as OpenAI and vLLM define it."""
    output: list[int] = []
    for _ in range(params.max_tokens):
        scores = hf_logits(model, prompt + output)
        if len(output) < params.min_tokens:
            for token in eos:
                scores[token] = float("-inf")
        for token, bias in params.logit_bias:
            scores[token] += bias
        for token in set(prompt + output):
            if params.repetition_penalty != 1.0:
                value = scores[token]
                penalty = params.repetition_penalty
                scores[token] = value / penalty if value > 0 else value * penalty
        for token in set(output):
            scores[token] -= params.frequency_penalty * output.count(token)
            scores[token] -= params.presence_penalty
        output.append(int(scores.argmax()))
        if output[-1] in eos and len(output) >= params.min_tokens and not params.ignore_eos:
            break
    return output


def greedy(**kwargs: Any) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kwargs)


def test_logprobs_equal_log_softmax_of_hf_logits(engine: LLMEngine, reference: Any) -> None:
    prompt = prompts_of_lengths([9])[0]
    [stream] = engine.generate([prompt], greedy(logprobs=5))
    tokens, logprobs = stream.token_ids, stream.logprobs

    assert [lp.token_id for lp in logprobs] == tokens and len(tokens) == MAX_TOKENS
    for position, logprob in enumerate(logprobs):
        expected = torch.log_softmax(hf_logits(reference, prompt + tokens[:position]), dim=-1)
        assert logprob.logprob == pytest.approx(float(expected[tokens[position]]), abs=1e-4)
        top_ids = [t for t, _ in logprob.top]
        top_values = [v for _, v in logprob.top]
        assert top_ids == torch.topk(expected, 5).indices.tolist()
        assert top_values == sorted(top_values, reverse=True)
        assert top_values == pytest.approx(torch.topk(expected, 5).values.tolist(), abs=1e-4)
        assert top_ids[0] == tokens[position]  # greedy: the chosen token is the likeliest


def test_logprobs_zero_gives_the_chosen_token_only(engine: LLMEngine) -> None:
    [stream] = engine.generate([prompts_of_lengths([5])[0]], greedy(logprobs=0))
    assert len(stream.logprobs) == MAX_TOKENS
    assert all(lp.top == () and lp.logprob <= 0.0 for lp in stream.logprobs)


@pytest.mark.parametrize(
    "features",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 0.8},
        {"repetition_penalty": 1.7},
        {"logit_bias": ((1234, 9.0), (4321, -3.0))},
        {"presence_penalty": -0.5, "frequency_penalty": 1.2, "repetition_penalty": 1.3},
    ],
)
def test_processing_matches_the_reference(
    engine: LLMEngine, reference: Any, features: dict[str, Any]
) -> None:
    prompt = prompts_of_lengths([7], seed=0)[0]  # its greedy output repeats a token
    params = greedy(**features)
    [stream] = engine.generate([prompt], params)
    assert stream.token_ids == reference_greedy(reference, prompt, params)
    assert stream.token_ids != engine.generate([prompt], greedy())[0].token_ids  # it changed


def test_a_resumed_request_continues_its_penalties_exactly(engine: LLMEngine) -> None:
    """A migrated request (prompt + the tokens shown, ``output_in_prompt``) continues
    token for token as the undisturbed one, wherever it moved; without the count its
    presence and frequency penalties restart and the output changes."""
    prompt = prompts_of_lengths([7], seed=0)[0]  # its greedy output repeats a token
    features = {"presence_penalty": 1.5, "frequency_penalty": 0.8}
    [whole] = engine.generate([prompt], greedy(**features))
    restarted_differs = []
    for shown in range(1, MAX_TOKENS):
        resumed_prompt = prompt + whole.token_ids[:shown]
        rest = SamplingParams(
            max_tokens=MAX_TOKENS - shown, temperature=0.0, ignore_eos=True, **features
        )
        [resumed] = engine.generate([resumed_prompt], replace(rest, output_in_prompt=shown))
        [restarted] = engine.generate([resumed_prompt], rest)
        assert resumed.token_ids == whole.token_ids[shown:], shown
        restarted_differs.append(restarted.token_ids != whole.token_ids[shown:])
    assert any(restarted_differs)  # the bug this guards shows on this prompt


def test_min_tokens_counts_the_tokens_shown_before_a_move(engine: LLMEngine) -> None:
    eos = engine.parts.eos_token_ids[0]
    prompt = prompts_of_lengths([5], seed=5)[0]
    forced = ((eos, 50.0),)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=forced, min_tokens=4)
    [resumed] = engine.generate([[*prompt, 11, 12, 13]], replace(params, output_in_prompt=3))
    # 3 shown + 1 masked make min_tokens 4: EOS comes next (the undisturbed run's 5th).
    assert len(resumed.token_ids) == 2 and resumed.token_ids[-1] == eos


def test_logprobs_report_the_processed_logits(engine: LLMEngine, reference: Any) -> None:
    prompt = prompts_of_lengths([6], seed=4)[0]
    [stream] = engine.generate([prompt], greedy(logit_bias=((777, 30.0),), logprobs=1))
    assert stream.token_ids == [777] * MAX_TOKENS
    scores = hf_logits(reference, prompt)
    scores[777] += 30.0
    expected = float(torch.log_softmax(scores, dim=-1)[777])
    assert stream.logprobs[0].logprob == pytest.approx(expected, abs=1e-4)


def test_min_tokens_masks_eos_until_reached(engine: LLMEngine) -> None:
    eos = engine.parts.eos_token_ids[0]
    prompt = prompts_of_lengths([5], seed=5)[0]
    forced = ((eos, 50.0),)  # EOS would win every step
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=forced)
    [early] = engine.generate([prompt], params)
    [held] = engine.generate(
        [prompt],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=forced, min_tokens=4),
    )
    assert early.token_ids == [eos] and early.finish_reason == "stop"
    assert len(held.token_ids) == 5 and held.token_ids[-1] == eos
    assert eos not in held.token_ids[:4] and held.finish_reason == "stop"


def test_a_mixed_batch_changes_no_request(engine: LLMEngine) -> None:
    prompts = prompts_of_lengths([5, 17, 9, 30], seed=6)
    mixed = [
        greedy(),
        greedy(presence_penalty=1.0, logprobs=3),
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=7, ignore_eos=True),
        greedy(logit_bias=((55, 4.0),), frequency_penalty=0.5),
    ]
    alone = [engine.generate([p], params)[0] for p, params in zip(prompts, mixed, strict=True)]
    streams = [engine.add_request(p, params) for p, params in zip(prompts, mixed, strict=True)]
    while not all(s.finished for s in streams):
        engine.step()
    assert [s.token_ids for s in streams] == [s.token_ids for s in alone]
    batched, single = streams[1].logprobs, alone[1].logprobs
    assert [[t for t, _ in lp.top] for lp in batched] == [[t for t, _ in lp.top] for lp in single]
    # Another batch shape rounds float32 matmuls in another order: equal to 1e-4.
    assert [lp.logprob for lp in batched] == pytest.approx([lp.logprob for lp in single], abs=1e-4)
    assert streams[0].logprobs == [] and len(streams[1].logprobs) == MAX_TOKENS


def test_a_logit_bias_outside_the_vocabulary_is_refused(engine: LLMEngine) -> None:
    vocab = engine.parts.model_config.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias names token id {vocab}"):
        engine.add_request([1, 2, 3], greedy(logit_bias=((vocab, 1.0),)))


def test_siblings_started_after_the_first_token_share_the_prompt_blocks(
    tiny_llama_folder: Path,
) -> None:
    """The order ``serving.choices`` submits ``n`` siblings in: the first, then (once it
    has a token) the others, which find its full prompt blocks in the prefix cache."""
    engine = make_engine(tiny_llama_folder, num_kv_blocks=64)
    pool = engine.parts.kv_manager.pool
    prompt = prompts_of_lengths([40], seed=8)[0]  # 2 full blocks of 16, then 8 tokens
    params = [
        SamplingParams(max_tokens=4, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)
    ]
    first = engine.add_request(prompt, params[0])
    while not first.token_ids:
        engine.step()
    assert pool.num_blocks - pool.num_free_blocks == 3  # ceil(40 / 16)
    siblings = [engine.add_request(prompt, p) for p in params[1:]]
    engine.step()  # admits both: 2 cached blocks each, 1 new block for tokens 32..39
    assert pool.num_blocks - pool.num_free_blocks == 3 + 2 * 1
    assert engine.stats().prefix_hit_tokens == 2 * 32
    while not all(s.finished for s in [first, *siblings]):
        engine.step()
    texts = {tuple(s.token_ids) for s in [first, *siblings]}
    assert len(texts) == 3  # three seeds, three different choices
