"""Per-request sampling parameters and the batched sampler.

Greedy rows take an argmax over the whole batch at once; sampled rows apply temperature,
top-k and top-p and draw from their own ``torch.Generator``, seeded from the request's
``seed`` so a seeded request gives the same text whatever else is in the batch.

On a GPU the logits never leave it: sampled rows filter on the device and draw with the
exponential race (``argmax(p / E)``, E ~ Exp(1), which picks i with probability p_i),
the noise coming from a device generator re-seeded per row and step from the request's
own CPU generator. The chosen ids are written into one device tensor, so the step's only
host synchronisation is the copy that returns them.
"""

from __future__ import annotations

import torch

from dynask.actors.api.sampling_params import SamplingParams


def make_generator(seed: int | None, fallback: torch.Generator) -> torch.Generator:
    """A CPU generator for one request: seeded by the request, else by the engine's RNG."""
    generator = torch.Generator()
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=fallback).item())
    generator.manual_seed(seed)
    return generator


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


def _sample_on_device(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    chosen = logits.argmax(dim=-1)
    noise: torch.Generator | None = None
    for row, row_params in enumerate(params):
        if row_params.greedy:
            continue
        noise = noise or torch.Generator(device=logits.device)
        seed = int(torch.randint(0, 2**62, (1,), generator=generators[row]).item())  # CPU
        chosen[row] = _race_row(logits[row], row_params, noise.manual_seed(seed))
    return [int(t) for t in chosen.tolist()]


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
