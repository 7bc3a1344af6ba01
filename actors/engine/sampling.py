"""Per-request sampling parameters and the batched sampler.

Greedy rows take an argmax over the whole batch at once; sampled rows apply temperature,
top-k and top-p and draw from a generator handed in per row and step.

The draws are counter-based: the generator for the token at position ``p`` of a request
is seeded with ``draw_seed(request_seed, p)`` (a splitmix64 mix of both), so every sampled
token is a function of the request's seed and its position alone — not of how many draws
came before, nor of what else is in the batch. That is what lets a request continue on
another engine after its actor is lost: the resumed request (prompt plus the tokens the
client has) draws the next position exactly as the lost engine would have. Re-seeding a
CPU generator costs a few microseconds a row; ``bench/engine/sampler.py`` measures the
sampler against one stateful generator per request.

On a GPU the logits never leave it: sampled rows filter on the device and draw with the
exponential race (``argmax(p / E)``, E ~ Exp(1), which picks i with probability p_i),
the noise coming from a device generator (Philox) seeded with the row's draw seed. The
chosen ids are written into one device tensor, so the step's only host synchronisation
is the copy that returns them.
"""

from __future__ import annotations

import torch

from dynask.actors.api.sampling_params import SamplingParams

_MASK64 = 2**64 - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment


def request_seed(seed: int | None, fallback: torch.Generator) -> int:
    """The seed of one request's draws: its own, else a fresh one from the engine's RNG."""
    if seed is not None:
        return seed
    return int(torch.randint(0, 2**62, (1,), generator=fallback).item())


def draw_seed(seed: int, position: int) -> int:
    """The seed of the draw for the token at ``position`` (splitmix64 of seed and position)."""
    z = (seed + (position + 1) * _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def draw_generator(generator: torch.Generator, seed: int, position: int) -> torch.Generator:
    """``generator`` re-seeded for the draw at ``position`` of a request seeded ``seed``."""
    return generator.manual_seed(draw_seed(seed, position))


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    """Picks one token per row of ``logits`` ([rows, vocab], float32)."""
    if logits.device.type != "cpu":
        return _sample_on_device(logits, params, generators)
    chosen = logits.argmax(dim=-1).tolist()
    for row, row_params in enumerate(params):
        if not row_params.greedy:
            chosen[row] = _sample_row(logits[row], row_params, generators[row])
    return [int(t) for t in chosen]


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    scores = logits.float().cpu() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        scores = _top_p_filter(scores, params.top_p)
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keeps the smallest set of tokens whose probability reaches ``top_p``."""
    sorted_scores, order = torch.sort(scores, descending=True)
    cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sample_tensor(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> torch.Tensor:
    """``sample`` as a tensor of ids where the logits are: on a GPU nothing waits for it."""
    if logits.device.type != "cpu":
        return _chosen_on_device(logits, params, generators)
    return torch.tensor(sample(logits, params, generators), dtype=torch.long)


def _sample_on_device(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    return [int(t) for t in _chosen_on_device(logits, params, generators).tolist()]


def _chosen_on_device(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> torch.Tensor:
    chosen = logits.argmax(dim=-1)
    noise: torch.Generator | None = None
    for row, row_params in enumerate(params):
        if row_params.greedy:
            continue
        noise = noise or torch.Generator(device=logits.device)
        seed = generators[row].initial_seed()  # the row's draw seed (``draw_generator``)
        chosen[row] = _race_row(logits[row], row_params, noise.manual_seed(seed))
    return chosen


def _race_row(logits: torch.Tensor, params: SamplingParams, noise: torch.Generator) -> torch.Tensor:
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        scores = _top_p_filter(scores, params.top_p)
    probs = torch.softmax(scores, dim=-1)
    race = torch.empty_like(probs).exponential_(generator=noise)
    return (probs / race).argmax()
