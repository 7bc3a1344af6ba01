"""Benchmark of the built-in engine on this CPU, against HF transformers in the same run.

What it measures, with the default SmolLM2-135M-Instruct model:

* Output throughput at batch 1, 8 and 32: prompts of random token ids (a fixed seed per
  batch size), greedy decoding of a fixed number of new tokens (EOS ignored). Throughput
  is ``batch * new_tokens / wall seconds`` end to end, prefill included, for our engine
  and for ``transformers`` ``generate``. Each batch size runs ours then HF back to back,
  so a noisy shared machine slows both alike; the ratio ours/HF is what to compare.
  With ``--repeats N`` each side keeps its best run (fresh prompts each time, so our
  prefix cache never helps). Our decode-only rate (tokens after every sequence has its
  first one) is reported too, and how many rows match HF's greedy tokens exactly. A row
  may differ without a bug: HF's ``min_new_tokens`` masks EOS, while ``ignore_eos`` lets
  our engine pick EOS (and carry on) where it is the argmax.
* Time to first token of a long prompt: cold (a fresh prompt), then the same prompt
  again, whose full blocks are now in the prefix cache. The median of a few trials.

The goals from the issue are evaluated at the end: ratio >= 2 at batch 32, ratio >= 1 at
batch 1, TTFT speed-up >= 5 with a cached prefix.

Run it from the repository root (about ten minutes on two cores)::

    .venv/bin/python bench/engine.py            # full run
    .venv/bin/python bench/engine.py --quick    # smoke run: batches 1,8 and 32 new tokens
    .venv/bin/python bench/engine.py --skip-hf  # our engine only

It prints a table and writes JSON to ``bench/results/engine.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.loader import resolve_model
from dynask.actors.engine.sampling import SamplingParams

TOKEN_ID_RANGE = (100, 40_000)  # plain vocabulary ids, clear of the special tokens
SEED = 20_240_601
TTFT_SEED = SEED + 10_000_000  # apart from the batch prompts, so nothing is cached by chance
FULL_BATCHES = (1, 8, 32)
QUICK_BATCHES = (1, 8)
FULL_NEW_TOKENS = 128
QUICK_NEW_TOKENS = 32
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "engine.json"


@dataclass(frozen=True)
class BenchConfig:
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    ttft_prompt_len: int
    ttft_trials: int
    repeats: int
    threads: int
    skip_hf: bool


@dataclass(frozen=True)
class OursRun:
    seconds: float
    decode_tok_s: float | None  # None when there is no decode phase (one new token)
    outputs: list[list[int]]


@dataclass(frozen=True)
class HFRun:
    seconds: float
    outputs: list[list[int]]


@dataclass(frozen=True)
class ThroughputRow:
    """One batch size; the rates are the best of the repeats (the least disturbed run)."""

    batch: int
    ours_tok_s: float
    hf_tok_s: float | None
    ratio: float | None
    ours_decode_tok_s: float | None
    rows_matching_hf: int | None  # rows whose greedy tokens equal HF's exactly
    rows_compared: int
    ours_runs_tok_s: list[float]
    hf_runs_tok_s: list[float]


@dataclass(frozen=True)
class FirstToken:
    seconds: float
    cached_tokens: int


@dataclass(frozen=True)
class TTFTResult:
    prompt_len: int
    trials: int
    cold_ms: float
    cached_ms: float
    speedup: float
    cached_tokens: int


# ---- prompts ------------------------------------------------------------------------------


def random_prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``length`` random token ids; the same seed gives the same ids."""
    generator = torch.Generator().manual_seed(seed)
    low, high = TOKEN_ID_RANGE
    return torch.randint(low, high, (batch, length), generator=generator).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# ---- our engine ---------------------------------------------------------------------------


def run_ours(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> OursRun:
    """Runs the prompts to completion with the step API, timing the decode phase apart."""
    start = time.perf_counter()
    streams = [engine.add_request(p, greedy(new_tokens)) for p in prompts]
    have_first: set[str] = set()
    decode_start: float | None = None
    decode_tokens = 0
    while not all(s.finished for s in streams):
        outputs = engine.step()
        if decode_start is not None:
            decode_tokens += sum(len(o.token_ids) for o in outputs)
            continue
        have_first.update(o.request_id for o in outputs if o.token_ids)
        if len(have_first) == len(streams):
            decode_start = time.perf_counter()
    end = time.perf_counter()
    decode_tok_s = None
    if decode_start is not None and decode_tokens:
        decode_tok_s = decode_tokens / (end - decode_start)
    return OursRun(end - start, decode_tok_s, [s.token_ids for s in streams])


def time_to_first_token(engine: LLMEngine, prompt: list[int]) -> FirstToken:
    """Seconds from adding the request until a step hands out its first token."""
    start = time.perf_counter()
    stream = engine.add_request(prompt, greedy(1))
    while not any(o.request_id == stream.request_id and o.token_ids for o in engine.step()):
        pass
    elapsed = time.perf_counter() - start
    while not stream.finished:
        engine.step()
    usage = stream.usage
    return FirstToken(elapsed, usage.cached_tokens if usage else 0)


def measure_ttft(engine: LLMEngine, config: BenchConfig) -> TTFTResult:
    """Median cold and cached TTFT over fresh prompts (each one sent twice)."""
    cold: list[FirstToken] = []
    cached: list[FirstToken] = []
    for trial in range(config.ttft_trials):
        prompt = random_prompts(1, config.ttft_prompt_len, TTFT_SEED + trial)[0]
        cold.append(time_to_first_token(engine, prompt))
        cached.append(time_to_first_token(engine, prompt))
    cold_s = statistics.median(t.seconds for t in cold)
    cached_s = statistics.median(t.seconds for t in cached)
    return TTFTResult(
        prompt_len=config.ttft_prompt_len,
        trials=config.ttft_trials,
        cold_ms=cold_s * 1e3,
        cached_ms=cached_s * 1e3,
        speedup=cold_s / cached_s,
        cached_tokens=min(t.cached_tokens for t in cached),
    )


# ---- HF transformers ----------------------------------------------------------------------


def load_hf_model(folder: Path) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()  # generation-config chatter, not results
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def run_hf(model: Any, prompts: list[list[int]], new_tokens: int) -> HFRun:
    """``generate`` with greedy decoding of exactly ``new_tokens`` tokens per row."""
    start = time.perf_counter()
    input_ids = torch.tensor(prompts, dtype=torch.long)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=model.config.eos_token_id,
    )
    seconds = time.perf_counter() - start
    return HFRun(seconds, output[:, input_ids.shape[1] :].tolist())


# ---- the run ------------------------------------------------------------------------------


def warm_up(engine: LLMEngine, hf_model: Any | None) -> None:
    """One small generate each, so one-time costs (allocator, kernels) are paid here."""
    prompts = random_prompts(2, 32, SEED - 1)
    engine.generate(prompts, greedy(4))
    if hf_model is not None:
        run_hf(hf_model, prompts, 4)


def measure_batch(
    engine: LLMEngine, hf_model: Any | None, batch: int, config: BenchConfig
) -> ThroughputRow:
    """Ours, then HF on the same prompts, so both see the machine in the same state.

    Each repeat uses fresh prompts: a repeated prompt would hit our prefix cache.
    """
    ours_runs: list[OursRun] = []
    hf_runs: list[HFRun] = []
    for repeat in range(config.repeats):
        prompts = random_prompts(batch, config.prompt_len, SEED + 1_000 * batch + repeat)
        ours_runs.append(run_ours(engine, prompts, config.new_tokens))
        if hf_model is not None:
            hf_runs.append(run_hf(hf_model, prompts, config.new_tokens))
    return summarize_batch(batch, config.new_tokens, ours_runs, hf_runs)


def summarize_batch(
    batch: int, new_tokens: int, ours_runs: list[OursRun], hf_runs: list[HFRun]
) -> ThroughputRow:
    generated = batch * new_tokens
    ours_rates = [generated / run.seconds for run in ours_runs]
    hf_rates = [generated / run.seconds for run in hf_runs]
    decode_rates = [run.decode_tok_s for run in ours_runs if run.decode_tok_s is not None]
    ours_best = max(ours_rates)
    hf_best = max(hf_rates) if hf_rates else None
    return ThroughputRow(
        batch=batch,
        ours_tok_s=ours_best,
        hf_tok_s=hf_best,
        ratio=ours_best / hf_best if hf_best else None,
        ours_decode_tok_s=max(decode_rates) if decode_rates else None,
        rows_matching_hf=matching_rows(ours_runs, hf_runs) if hf_runs else None,
        rows_compared=batch * len(hf_runs),
        ours_runs_tok_s=ours_rates,
        hf_runs_tok_s=hf_rates,
    )


def matching_rows(ours_runs: list[OursRun], hf_runs: list[HFRun]) -> int:
    """How many rows of greedy output are token for token the same as HF's."""
    return sum(
        ours == hf
        for ours_run, hf_run in zip(ours_runs, hf_runs, strict=True)
        for ours, hf in zip(ours_run.outputs, hf_run.outputs, strict=True)
    )


def evaluate_goals(rows: list[ThroughputRow], ttft: TTFTResult) -> dict[str, bool | None]:
    """The issue's targets; None where this run did not measure what a goal needs."""
    ratio = {row.batch: row.ratio for row in rows}

    def at_least(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target

    return {
        "ratio_batch32_ge_2": at_least(ratio.get(32), 2.0),
        "ratio_batch1_ge_1": at_least(ratio.get(1), 1.0),
        "ttft_speedup_ge_5": at_least(ttft.speedup, 5.0),
    }


def machine_facts() -> dict[str, Any]:
    import transformers

    return {
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers_version": transformers.__version__,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
    }


# ---- output -------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(
    rows: list[ThroughputRow], ttft: TTFTResult, goals: dict[str, bool | None], config: BenchConfig
) -> str:
    lines = [
        f"Throughput: {config.prompt_len}-token prompts, {config.new_tokens} new tokens, "
        f"greedy, best of {config.repeats}, {config.threads} torch threads",
        f"{'batch':>5}  {'ours tok/s':>10}  {'HF tok/s':>10}  {'ours/HF':>7}  "
        f"{'ours decode tok/s':>17}  {'rows = HF':>9}",
    ]
    for row in rows:
        matching = "-"
        if row.rows_matching_hf is not None:
            matching = f"{row.rows_matching_hf}/{row.rows_compared}"
        lines.append(
            f"{row.batch:>5}  {row.ours_tok_s:>10.1f}  {_fmt(row.hf_tok_s, '.1f'):>10}  "
            f"{_fmt(row.ratio, '.2f'):>7}  {_fmt(row.ours_decode_tok_s, '.1f'):>17}  "
            f"{matching:>9}"
        )
    lines += [
        "",
        f"TTFT: {ttft.prompt_len}-token prompt, median of {ttft.trials}",
        f"{'cold ms':>9}  {'cached ms':>9}  {'speed-up':>8}  {'cached tokens':>13}",
        f"{ttft.cold_ms:>9.1f}  {ttft.cached_ms:>9.1f}  {ttft.speedup:>7.1f}x  "
        f"{ttft.cached_tokens:>13}",
        "",
        "Goals",
    ]
    for name, met in goals.items():
        verdict = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"  {name:<20}  {verdict}")
    return "\n".join(lines)


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# ---- command line -------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def batch_sizes(text: str) -> tuple[int, ...]:
    return tuple(positive_int(part) for part in text.split(","))


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=batch_sizes, help="comma-separated (default 1,8,32)")
    parser.add_argument("--prompt-len", type=positive_int, default=256)
    parser.add_argument("--new-tokens", type=positive_int, help="per request (default 128)")
    parser.add_argument("--ttft-prompt-len", type=positive_int, default=1000)
    parser.add_argument("--ttft-trials", type=positive_int, default=3)
    parser.add_argument("--repeats", type=positive_int, default=1, help="best run is kept")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--skip-hf", action="store_true", help="measure our engine only")
    parser.add_argument("--quick", action="store_true", help="batches 1,8 and 32 new tokens")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    batches = args.batches or (QUICK_BATCHES if args.quick else FULL_BATCHES)
    new_tokens = args.new_tokens or (QUICK_NEW_TOKENS if args.quick else FULL_NEW_TOKENS)
    config = BenchConfig(
        batches=batches,
        prompt_len=args.prompt_len,
        new_tokens=new_tokens,
        ttft_prompt_len=args.ttft_prompt_len,
        ttft_trials=args.ttft_trials,
        repeats=args.repeats,
        threads=args.threads or torch.get_num_threads(),
        skip_hf=args.skip_hf,
    )
    return config, args.out


def main(argv: list[str] | None = None) -> None:
    config, out_path = parse_args(argv)
    torch.set_num_threads(config.threads)
    facts = machine_facts()
    engine = LLMEngine(EngineConfig())
    hf_model = None if config.skip_hf else load_hf_model(resolve_model(None).folder)
    warm_up(engine, hf_model)
    rows = []
    for batch in config.batches:
        rows.append(measure_batch(engine, hf_model, batch, config))
        print(f"batch {batch} done", flush=True)
    ttft = measure_ttft(engine, config)
    goals = evaluate_goals(rows, ttft)
    print()
    print(format_table(rows, ttft, goals, config))
    report = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**facts, "load_average_end": list(os.getloadavg())},
        "model": engine.parts.model_origin,
        "config": asdict(config),
        "throughput": [asdict(row) for row in rows],
        "ttft": asdict(ttft),
        "goals": goals,
    }
    write_json(out_path, report)
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
