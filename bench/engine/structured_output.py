"""Structured outputs: grammar-constrained against unconstrained decoding, same run.

What it measures, with the default SmolLM2-135M-Instruct model on this machine's CPU:

* Output tokens/s at batch 1 and 32 (``--batches``): chat prompts asking for records,
  greedy, ``--new-tokens`` tokens each. The constrained requests carry a typical JSON
  schema (an object with a nested address, an enum, bounded integers, a pattern and an
  array of records with ``minItems``), so every request runs the full ``--new-tokens``
  under the grammar, the same count as the unconstrained ones (EOS ignored there). The
  two kinds run alternately, ``--repeats`` times each, best run kept; the ratio
  constrained/unconstrained is the number to compare (goal: >= 0.90 at batch 32).
* Per decode step: the mean step time of each kind, their difference (the overhead) and
  the part of it spent filling and applying the token bitmask.
* Compile time of the schema: the control plane's check (``build_grammar``), building
  the tokenizer's index (once per engine), compiling the schema (once per schema), and
  a cache hit.

Run it from the repository root::

    .venv/bin/python -m bench.engine.structured_output             # full run
    .venv/bin/python -m bench.engine.structured_output --quick     # smoke run

It prints a table and writes JSON to ``bench/results/structured_output.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.common.report import write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.structured_output import StructuredOutput, build_grammar
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.grammar.structured_output import LogitsMask, StructuredOutputs
from dynask.actors.engine.model_runner import ModelRunner

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["engineer", "designer", "manager"]},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "floor": {"type": "integer"},
            },
            "required": ["city", "floor"],
        },
    },
    "required": ["name", "age", "role", "zip", "address"],
}
SCHEMA = {
    "type": "object",
    "properties": {"records": {"type": "array", "items": RECORD, "minItems": 50}},
    "required": ["records"],
}
QUESTIONS = ["engineers in Paris", "designers in Lyon", "managers in Nice", "staff in Lille"]


@dataclass
class Run:
    seconds: float
    tokens: int
    decode_steps: int
    decode_seconds: float
    mask_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def step_ms(self) -> float:
        return 1000 * self.decode_seconds / max(self.decode_steps, 1)


class TimedMask(LogitsMask):
    """The runner's mask, timed (what the grammar costs inside a step)."""

    def __init__(self, inner: LogitsMask) -> None:
        super().__init__(inner.vocab_size)
        self.seconds = 0.0

    def mask_logits(self, logits: torch.Tensor, seqs: Any) -> None:
        started = time.perf_counter()
        super().mask_logits(logits, seqs)
        self.seconds += time.perf_counter() - started


def prompts(engine: LLMEngine, batch: int) -> list[list[int]]:
    return [
        engine.apply_chat_template(
            [{"role": "user", "content": f"List {QUESTIONS[i % 4]} as JSON records ({i})."}]
        )
        for i in range(batch)
    ]


def params(new_tokens: int, constrained: bool) -> SamplingParams:
    grammar = StructuredOutput("json_schema", json.dumps(SCHEMA)) if constrained else None
    return SamplingParams(
        max_tokens=new_tokens, temperature=0.0, ignore_eos=True, structured_output=grammar
    )


def run_once(
    engine: LLMEngine, mask: TimedMask, batch: int, new_tokens: int, constrained: bool
) -> Run:
    mask.seconds = 0.0
    streams = [
        engine.add_request(p, params(new_tokens, constrained)) for p in prompts(engine, batch)
    ]
    started = time.perf_counter()
    decode_steps, decode_seconds = 0, 0.0
    while not all(s.finished for s in streams):
        step_started = time.perf_counter()
        engine.step()
        if engine.scheduler.running and all(
            s.num_computed_tokens > len(s.prompt_token_ids) for s in engine.scheduler.running
        ):
            decode_steps += 1
            decode_seconds += time.perf_counter() - step_started
    seconds = time.perf_counter() - started
    tokens = sum(len(s.token_ids) for s in streams)
    if constrained:
        _check_prefix_valid(streams)
    return Run(seconds, tokens, decode_steps, decode_seconds, mask.seconds)


def _check_prefix_valid(streams: list[Any]) -> None:
    """The constrained text is JSON in the making: it starts as the schema says."""
    opening = '{"records": [{"name": "'
    for stream in streams:
        text = stream.text
        assert text.startswith(opening) or opening.startswith(text), text[:60]


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.seconds)


def measure_batch(
    engine: LLMEngine, mask: TimedMask, batch: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    free: list[Run] = []
    constrained: list[Run] = []
    for _ in range(repeats):  # alternate, so load on a shared machine hits both alike
        free.append(run_once(engine, mask, batch, new_tokens, constrained=False))
        constrained.append(run_once(engine, mask, batch, new_tokens, constrained=True))
    a, b = best(free), best(constrained)
    return {
        "batch": batch,
        "unconstrained": asdict(a) | {"tokens_per_s": a.tokens_per_s, "step_ms": a.step_ms},
        "constrained": asdict(b) | {"tokens_per_s": b.tokens_per_s, "step_ms": b.step_ms},
        "throughput_ratio": b.tokens_per_s / a.tokens_per_s,
        "step_overhead_ms": b.step_ms - a.step_ms,
        "mask_ms_per_step": 1000 * b.mask_seconds / max(b.decode_steps + 1, 1),
        "all_runs": {
            "unconstrained": [asdict(r) for r in free],
            "constrained": [asdict(r) for r in constrained],
        },
    }


def timed(action: Callable[[], Any], repeats: int = 1) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        action()
    return 1000 * (time.perf_counter() - started) / repeats


def measure_compile(engine: LLMEngine) -> dict[str, float]:
    spec = StructuredOutput("json_schema", json.dumps(SCHEMA))
    fresh = StructuredOutputs(
        engine.tokenizer, engine.parts.model_config.vocab_size, engine.parts.eos_token_ids
    )
    check_ms = timed(lambda: build_grammar(spec), repeats=5)
    index_ms = timed(fresh._get_compiler)
    compile_ms = timed(lambda: fresh.compiled(spec))
    hit_ms = timed(lambda: fresh.compiled(spec), repeats=100)
    matcher_ms = timed(lambda: fresh.start(spec, [1, 2, 3]), repeats=20)
    return {
        "control_plane_check_ms": check_ms,
        "tokenizer_index_ms": index_ms,
        "schema_compile_ms": compile_ms,
        "cache_hit_ms": hit_ms,
        "new_matcher_ms": matcher_ms,
    }


def machine_facts() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


def format_table(rows: list[dict[str, Any]], compile_times: dict[str, float]) -> str:
    lines = [
        f"{'batch':>5} {'free tok/s':>11} {'grammar tok/s':>14} {'ratio':>6} "
        f"{'free ms/step':>13} {'grammar ms/step':>16} {'overhead ms':>12} {'mask ms':>8}"
    ]
    for row in rows:
        a, b = row["unconstrained"], row["constrained"]
        lines.append(
            f"{row['batch']:>5} {a['tokens_per_s']:>11.1f} {b['tokens_per_s']:>14.1f} "
            f"{row['throughput_ratio']:>6.3f} {a['step_ms']:>13.2f} {b['step_ms']:>16.2f} "
            f"{row['step_overhead_ms']:>12.2f} {row['mask_ms_per_step']:>8.2f}"
        )
    lines.append("")
    lines += [f"{name:>24}: {value:9.3f} ms" for name, value in compile_times.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default=None, help="an HF folder or .gguf (default: SmolLM2)")
    parser.add_argument(
        "--quick", action="store_true", help="batches 1,8 and 16 new tokens, 1 repeat"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/structured_output.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.new_tokens, args.repeats = "1,8", 16, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    load_start = os.getloadavg()
    engine = LLMEngine(EngineConfig(model=args.model, max_num_seqs=max(batches)))
    runner = engine.parts.runner
    assert isinstance(runner, ModelRunner)
    mask = TimedMask(runner.grammar_mask)
    runner.grammar_mask = mask
    compile_times = measure_compile(engine)
    run_once(engine, mask, 1, 4, constrained=True)  # warm-up: compile, first allocations
    rows = [measure_batch(engine, mask, b, args.new_tokens, args.repeats) for b in batches]
    table = format_table(rows, compile_times)
    print(table)
    last = rows[-1]
    goal = last["throughput_ratio"] >= 0.90
    verdict = "met" if goal else "NOT met"
    print(f"\ngoal (grammar >= 90% of free tokens/s at batch {last['batch']}): {verdict}")
    report = {
        "time": datetime.now(UTC).isoformat(),
        "machine": machine_facts() | {"load_average_start": load_start},
        "config": {
            "batches": batches,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "schema": SCHEMA,
        },
        "rows": rows,
        "compile": compile_times,
        "goal_ratio_at_largest_batch": goal,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
