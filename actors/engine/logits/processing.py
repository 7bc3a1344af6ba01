"""What happens to a step's logits before the draw: penalties, logit bias, min_tokens.

Design decisions:

* Rows whose request asks for none of these pass through untouched, and a step where no
  row asks returns the very tensor it was given: requests that use none of the features
  pay one attribute check per row.
* The processed logits are a copy. On CUDA a decode step's logits are a graph's static
  output, and the logprobs (``actors.engine.logits.logprobs``) are read from the processed
  copy, so what a request reports is what its sampler saw.
* Each request keeps its generated-token counts on the logits' device
  (``TokenCounts``), updated with only the tokens added since the last step, so a long
  output costs the same per step as a short one.
* The order is vLLM's: ``min_tokens`` and ``logit_bias`` first, then the repetition
  penalty (CTRL: a positive logit is divided by it, a negative one multiplied, for every
  token of the prompt and the output), then the frequency penalty (minus it per time a
  token was generated) and the presence penalty (minus it once for a generated token).
  ``min_tokens`` masks EOS and the request's stop token ids; stop strings still apply.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch

from dynask.actors.api.sampling_params import SamplingParams


@dataclass(eq=False)
class TokenCounts:
    """One request's generated-token counts (and, for the repetition penalty, every token
    it has seen, prompt included), kept on the device of the logits."""

    counts: torch.Tensor  # [vocab] float32: times each token was generated
    seen: torch.Tensor | None  # [vocab] bool: in the prompt or the output
    counted: int = 0  # output tokens already in ``counts``

    @classmethod
    def start(
        cls, prompt: list[int], params: SamplingParams, vocab: int, device: torch.device
    ) -> TokenCounts:
        counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        shown = prompt[len(prompt) - params.output_in_prompt :] if params.output_in_prompt else []
        if shown:  # generated before a migration: counted as output
            ids = torch.tensor(shown, dtype=torch.long, device=device)
            counts.index_add_(0, ids, torch.ones(len(shown), device=device))
        seen = None
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        return cls(counts, seen)

    def update(self, output: list[int]) -> None:
        new = output[self.counted :]
        if not new:
            return
        ids = torch.tensor(new, dtype=torch.long, device=self.counts.device)
        self.counts.index_add_(0, ids, torch.ones(len(new), device=self.counts.device))
        if self.seen is not None:
            self.seen[ids] = True
        self.counted = len(output)


class LogitsRow(Protocol):
    """What the processor needs of one row's request (``Sequence`` satisfies it)."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    token_counts: TokenCounts | None


def check_logits_params(params: SamplingParams, vocab_size: int) -> None:
    """``ValueError`` naming ``logit_bias`` when a biased token id is outside the vocabulary."""
    bad = next((t for t, _ in params.logit_bias if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(
            f"logit_bias names token id {bad}, which is outside the vocabulary [0, {vocab_size})"
        )


def process_logits(
    logits: torch.Tensor, rows: Seq[LogitsRow], eos_token_ids: tuple[int, ...]
) -> torch.Tensor:
    """``logits`` ([rows, vocab]) after each row's penalties, bias and ``min_tokens``."""
    wanted = [i for i, row in enumerate(rows) if row.params.processes_logits]
    if not wanted:
        return logits
    processed = logits.float().clone()
    for i in wanted:
        _process_row(processed[i], rows[i], eos_token_ids)
    return processed


def _process_row(scores: torch.Tensor, row: LogitsRow, eos_token_ids: tuple[int, ...]) -> None:
    """Processes one row in place (a view into the step's processed copy)."""
    params = row.params
    if len(row.output_token_ids) + params.output_in_prompt < params.min_tokens:
        banned = [t for t in (*eos_token_ids, *params.stop_token_ids) if 0 <= t < scores.shape[0]]
        if banned:
            scores[torch.tensor(banned, dtype=torch.long, device=scores.device)] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor(
            [t for t, _ in params.logit_bias], dtype=torch.long, device=scores.device
        )
        bias = torch.tensor([b for _, b in params.logit_bias], device=scores.device)
        scores.index_add_(0, ids, bias)
    if not (
        params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
    ):
        return
    counts = _counts(row, scores)
    if counts.seen is not None:
        penalty = params.repetition_penalty
        penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
        scores.copy_(torch.where(counts.seen, penalised, scores))
    if params.frequency_penalty:
        scores.sub_(params.frequency_penalty * counts.counts)
    if params.presence_penalty:
        scores.sub_(params.presence_penalty * (counts.counts > 0).float())


def _counts(row: LogitsRow, scores: torch.Tensor) -> TokenCounts:
    if row.token_counts is None:
        row.token_counts = TokenCounts.start(
            row.prompt_token_ids, row.params, scores.shape[0], scores.device
        )
    row.token_counts.update(row.output_token_ids)
    return row.token_counts
