"""Logprobs of the sampled tokens, read from the logits the sampler saw.

A row's logprobs are the log-softmax of its processed logits (after penalties, bias and
``min_tokens``, and any grammar mask), before temperature, top-k and top-p: what a greedy
request reports is the model's own distribution, as transformers' scores give it, and a
biased or penalised token's logprob shows the change. Rows that ask for none cost
nothing; the others share one log-softmax and one top-k and one copy to the host.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from dynask.actors.api.outputs import TokenLogprob
from dynask.actors.api.sampling_params import SamplingParams


def compute_logprobs(
    logits: torch.Tensor, params: Seq[SamplingParams], chosen: list[int]
) -> list[TokenLogprob | None]:
    """Per row: the chosen token's logprob and its request's top ``logprobs`` (or None)."""
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
    result: list[TokenLogprob | None] = [None] * len(params)
    if not wanted:
        return result
    index = torch.tensor(wanted, dtype=torch.long, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    picked = torch.tensor([chosen[i] for i in wanted], dtype=torch.long, device=logits.device)
    chosen_lp = logprobs.gather(1, picked[:, None])[:, 0]
    k = max(params[i].logprobs or 0 for i in wanted)
    top = torch.topk(logprobs, k, dim=-1) if k else None
    values = chosen_lp[:, None] if top is None else torch.cat((chosen_lp[:, None], top.values), 1)
    host_values = values.tolist()
    top_ids = top.indices.tolist() if top is not None else [[] for _ in wanted]
    for n, row in enumerate(wanted):
        count = params[row].logprobs or 0
        pairs = tuple(zip(top_ids[n][:count], host_values[n][1 : count + 1], strict=True))
        result[row] = TokenLogprob(chosen[row], float(host_values[n][0]), pairs)
    return result
