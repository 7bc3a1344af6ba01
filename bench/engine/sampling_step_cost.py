"""Per-step cost of logits processing and logprobs, timed alone (no model).

A batch of 32 rows over SmolLM2's 49,152-token vocabulary, each with 32 prompt and 32
output tokens; ``process_logits`` + ``compute_logprobs`` as the model runner calls them,
best of 5 rounds of 50 steps, with 0, 8 and 32 rows asking for presence/frequency/
repetition penalties, logit_bias and ``logprobs: 5``. Compare with a decode step's time
(``bench/engine/throughput.py``). Prints a table and writes
``bench/results/sampling_step_cost.json``::

    .venv/bin/python -m bench.engine.sampling_step_cost
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.common.report import write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.logits.logprobs import compute_logprobs
from dynask.actors.engine.logits.processing import TokenCounts, process_logits

VOCAB, BATCH = 49152, 32
OUT = Path(__file__).resolve().parents[1] / "results" / "sampling_step_cost.json"
PLAIN = SamplingParams(max_tokens=64, temperature=0.0)
RICH = SamplingParams(
    max_tokens=64,
    temperature=0.0,
    presence_penalty=0.5,
    frequency_penalty=0.3,
    repetition_penalty=1.1,
    logit_bias=((100, 2.0),),
    logprobs=5,
)


@dataclass
class Row:
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    token_counts: TokenCounts | None = None


def step_ms(logits: torch.Tensor, featured: int, steps: int = 50) -> float:
    rows = [
        Row(RICH if i < featured else PLAIN, list(range(32)), list(range(100, 132)))
        for i in range(BATCH)
    ]
    params, chosen = [r.params for r in rows], [0] * BATCH
    process_logits(logits, rows, (2,))  # the counts start here, as on a first step
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(steps):
            compute_logprobs(process_logits(logits, rows, (2,)), params, chosen)
        best = min(best, (time.perf_counter() - started) / steps)
    return best * 1e3


def main() -> None:
    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(0))
    rows = [{"featured_rows": k, "ms_per_step": round(step_ms(logits, k), 3)} for k in (0, 8, 32)]
    print(f"batch {BATCH}, vocabulary {VOCAB}")
    print(f"{'rows with features':>19} {'ms per step':>12}")
    for row in rows:
        print(f"{row['featured_rows']:>19} {row['ms_per_step']:>12.3f}")
    OUT.parent.mkdir(exist_ok=True)
    write_json(OUT, rows)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
