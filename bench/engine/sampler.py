"""Sampler cost: counter-based draws (re-seeded per row and step) vs one stateful generator.

The built-in engine seeds the generator of every sampled row with ``draw_seed(seed,
position)`` before the draw, so a request can resume on another engine. This measures
what that costs: ``sample`` on random logits of the default model's vocabulary (49,152)
at batch 1 and 32, temperature 1.0 and top-p 0.95, once with generators that only run on
(the baseline: one stateful generator per request, as before) and once re-seeding them
per step (what the engine does), the two back to back in every step so both see the
same machine load; medians over the steps.

    .venv/bin/python -m bench.engine.sampler              # prints a table, writes JSON
    .venv/bin/python -m bench.engine.sampler --steps 400

Writes ``bench/results/sampler.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common.report import code_version, machine_facts, write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.sampling import draw_generator, sample

REPO = Path(__file__).resolve().parents[2]
VOCAB = 49152


def _paired_step_times(batch: int, steps: int) -> tuple[list[float], list[float]]:
    """Each step sampled twice back to back: stateful generators, then re-seeded ones."""
    logits = torch.randn((batch, VOCAB), generator=torch.Generator().manual_seed(batch))
    params = [SamplingParams(temperature=1.0, top_p=0.95)] * batch
    stateful = [torch.Generator().manual_seed(row) for row in range(batch)]
    scratch = [torch.Generator() for _ in range(batch)]
    stateful_times, counter_times = [], []
    for position in range(steps):
        start = time.perf_counter()
        sample(logits, params, stateful)
        middle = time.perf_counter()
        sample(logits, params, [draw_generator(g, row, position) for row, g in enumerate(scratch)])
        counter_times.append(time.perf_counter() - middle)
        stateful_times.append(middle - start)
    return stateful_times, counter_times


def run(batches: list[int], steps: int) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        stateful, counter = _paired_step_times(batch, steps)
        base, new = statistics.median(stateful), statistics.median(counter)
        rows.append(
            {
                "batch": batch,
                "stateful_ms": base * 1e3,
                "counter_based_ms": new * 1e3,
                "ratio": new / base,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/sampler.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    rows = run(args.batches, args.steps)
    print(f"{'batch':>5} {'stateful ms/step':>17} {'counter-based ms/step':>22} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['batch']:>5} {row['stateful_ms']:>17.3f} "
            f"{row['counter_based_ms']:>22.3f} {row['ratio']:>6.3f}"
        )
    document = {
        "benchmark": "sampler",
        "vocab": VOCAB,
        "steps": args.steps,
        "threads": args.threads,
        "rows": rows,
        "code": code_version(REPO),
        "machine": machine_facts(load_start),
    }
    write_json(args.out, document)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
