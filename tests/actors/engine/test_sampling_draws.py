"""Counter-based draws: a sampled token is a function of the request's seed and position.

That is what lets a seeded request continue exactly on another engine after a worker
loss (the control plane re-sends the prompt plus the tokens the client has).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.sampling import (
    _sample_on_device,
    draw_generator,
    draw_seed,
    request_seed,
    sample,
)
from tests.actors.engine.helpers import make_engine, prompts_of_lengths


@pytest.fixture(scope="module")
def engine(tiny_llama_folder: Path) -> LLMEngine:
    return make_engine(tiny_llama_folder, block_size=8)


def test_draw_seed_is_splitmix64_of_seed_and_position() -> None:
    # splitmix64's first outputs from state 0 (the reference values of the algorithm).
    assert draw_seed(0, 0) == 0xE220A8397B1DCDAF
    assert draw_seed(0, 1) == 0x6E789E6AA1B965F4
    assert draw_seed(-1, 0) == draw_seed(2**64 - 1, 0)  # negative seeds wrap to 64 bits
    assert draw_seed(7, 3) != draw_seed(7, 4) != draw_seed(8, 3)


def test_a_draw_depends_on_seed_and_position_not_on_earlier_draws() -> None:
    logits = torch.randn((1, 500), generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=1.0)]
    scratch = torch.Generator()
    fresh = sample(logits, params, [draw_generator(torch.Generator(), 11, 40)])
    for position in range(40):  # draws before it do not move it
        sample(logits, params, [draw_generator(scratch, 11, position)])
    assert sample(logits, params, [draw_generator(scratch, 11, 40)]) == fresh


def test_request_seed_is_the_requests_own_or_a_fresh_one() -> None:
    rng = torch.Generator().manual_seed(0)
    assert request_seed(-5, rng) == -5
    fresh = [request_seed(None, rng) for _ in range(3)]
    assert len(set(fresh)) == 3 and all(0 <= s < 2**62 for s in fresh)


def test_a_seeded_request_resumed_from_its_own_tokens_continues_exactly(
    engine: LLMEngine,
) -> None:
    prompt = prompts_of_lengths([12], seed=4)[0]
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=77, ignore_eos=True)
    whole = engine.generate([prompt], params)[0].token_ids

    resumed_params = SamplingParams(max_tokens=14, temperature=1.0, top_p=0.9, seed=77)
    other = prompts_of_lengths([20], seed=5)[0]  # in a batch with another request, too
    resumed = engine.generate([other, prompt + whole[:10]], resumed_params)[1].token_ids

    assert len(whole) == 24
    assert resumed == whole[10:]


def test_unseeded_requests_draw_different_tokens(engine: LLMEngine) -> None:
    prompt = prompts_of_lengths([12], seed=6)[0]
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    first, second = engine.generate([prompt, prompt], params)
    assert first.token_ids != second.token_ids


def test_the_device_paths_race_is_seeded_by_the_rows_draw_seed() -> None:
    # The CUDA path's draw (exponential race, noise from a device generator), run here on
    # CPU tensors: no GPU on this machine. Same (seed, position): same token.
    logits = torch.randn((2, 300), generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=50)]
    scratch = [torch.Generator(), torch.Generator()]
    draws = [
        _sample_on_device(logits, params, [draw_generator(g, 9, position) for g in scratch])
        for position in range(30)
    ]
    again = _sample_on_device(logits, params, [draw_generator(torch.Generator(), 9, 29)] * 2)

    assert again == draws[29]
    assert {row[0] for row in draws} == {int(logits[0].argmax())}  # the greedy row
    assert len({row[1] for row in draws}) > 1  # positions draw differently
