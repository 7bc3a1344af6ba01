"""What the sampling features cost in the built-in engine, and what they cost others.

Runs the bundled SmolLM2-135M-Instruct on the CPU (or ``--device cuda``): a batch of
``--batch`` requests, random prompts of 32 tokens, ``--new-tokens`` greedy tokens each
(EOS ignored), timed end to end, best of ``--repeats``. Scenarios, in one run:

* ``bypassed``: the logits-processing and logprobs steps replaced by no-ops (the engine
  as it was before these features): the baseline.
* ``none``: no request uses a feature (the per-row checks only).
* ``quarter``: a quarter of the rows use presence/frequency/repetition penalties,
  logit_bias and ``logprobs: 5``; the others none. The plain rows share every step with
  them, so the step time is what the plain rows pay.
* ``all``: every row uses them.

The ratios to ``bypassed`` are what to read (a shared machine slows all alike). Prints a
table and writes JSON to ``bench/results/sampling_features.json``::

    .venv/bin/python -m bench.engine.sampling_features
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from bench.common.report import write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine import model_runner
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine

OUT = Path(__file__).resolve().parents[1] / "results" / "sampling_features.json"
FEATURES: dict[str, Any] = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.3,
    "repetition_penalty": 1.1,
    "logit_bias": ((100, 2.0), (200, -2.0)),
    "logprobs": 5,
}


def run(engine: LLMEngine, batch: int, new_tokens: int, featured: int, seed: int) -> float:
    """Seconds to generate ``new_tokens`` for ``batch`` fresh prompts."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(100, 40000, (32,), generator=generator).tolist() for _ in range(batch)]
    plain = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    rich = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, **FEATURES)
    started = time.perf_counter()
    streams = [
        engine.add_request(p, rich if i < featured else plain) for i, p in enumerate(prompts)
    ]
    while not all(s.finished for s in streams):
        engine.step()
    return time.perf_counter() - started


# The model runner's logits steps as no-ops: the engine before these features.
_NO_OPS: dict[str, Any] = {
    "process_logits": lambda logits, rows, eos: logits,
    "compute_logprobs": lambda logits, params, chosen: [None] * len(params),
}


def _patch(steps: dict[str, Any]) -> None:
    """The model runner calls ``steps`` (by its module's names) from now on."""
    for name, step in steps.items():
        setattr(model_runner, name, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(device=args.device, max_num_seqs=max(64, args.batch)))
    real = {name: getattr(model_runner, name) for name in _NO_OPS}
    scenarios = {"bypassed": 0, "none": 0, "quarter": args.batch // 4, "all": args.batch}
    run(engine, 4, 4, 4, seed=999)  # warm-up
    seconds: dict[str, float] = {}
    for repeat in range(args.repeats):  # interleaved: drift on a shared machine hits all
        for name, featured in scenarios.items():
            _patch(_NO_OPS if name == "bypassed" else real)
            took = run(engine, args.batch, args.new_tokens, featured, seed=repeat * 10 + featured)
            _patch(real)
            seconds[name] = min(seconds.get(name, float("inf")), took)
    tokens = args.batch * args.new_tokens
    rows = []
    print(
        f"batch {args.batch}, {args.new_tokens} new tokens, {args.device}, best of {args.repeats}"
    )
    print(f"{'scenario':10} {'seconds':>8} {'tokens/s':>9} {'vs bypassed':>12}")
    for name, took in seconds.items():
        ratio = took / seconds["bypassed"]
        rows.append(
            {
                "scenario": name,
                "featured_rows": scenarios[name],
                "seconds": round(took, 3),
                "tokens_per_s": round(tokens / took, 1),
                "time_ratio": round(ratio, 3),
            }
        )
        print(f"{name:10} {took:8.2f} {tokens / took:9.1f} {ratio:12.3f}")
    OUT.parent.mkdir(exist_ok=True)
    write_json(OUT, {"args": vars(args), "rows": rows})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
