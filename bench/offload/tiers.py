"""Benchmark of the KV offload tiers: revisited long documents, tiers off / host / host+disk.

Two parts, both in one process on the built-in engine (the bundled SmolLM2 by default),
every configuration on the same weights (loaded once):

* **Workload** — ``--docs`` documents of ``--doc-len`` random tokens, each asked about
  ``--passes`` times (a fresh ``--question-len``-token question each time, ``--new-tokens``
  greedy tokens), documents shuffled per pass, one request at a time. The device KV cache
  holds a quarter of the working set, so without tiers most revisits recompute. Three
  configurations: tiers off; a host tier holding the whole working set; a host tier the
  size of the device cache plus a disk tier (default frequency filter: a block reaches
  the disk after its second use, so the disk pays off from the third pass). Reported:
  TTFT p50/p99 over the revisits (passes 2..N), throughput (prompt + output tokens per
  second over the whole run), tokens loaded from host and disk, and the ratios against
  tiers off.
* **Long prefix** — a ``--long-len``-token document (8,000 by default) with a short
  question: cold (recomputed), then another document of the same size evicts it from the
  device cache, then the first is asked again and its prefix loads from the host tier
  (one engine) or from the disk tier (another engine, disk only). Goal from the issue:
  TTFT from the host tier at least 5x faster than recomputing.

Run it from the repository root (about five minutes on two cores; do not run tests at
the same time)::

    .venv/bin/python -m bench.offload.tiers
    .venv/bin/python -m bench.offload.tiers --quick          # smaller: 4 docs of 512, long 2,000
    .venv/bin/python -m bench.offload.tiers --skip-long

It prints tables and writes ``bench/results/offload.json`` (``--out``). Disk-tier files go
to a temporary folder (``--disk-path`` to choose one: its speed matters).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.common.report import write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.engine_parts import LoadedModel, assemble_engine_parts
from dynask.actors.engine.loader import eos_token_ids, load_hf_config, load_model
from dynask.actors.engine.model_config import ModelConfig
from dynask.actors.models.model_source import resolve_model
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.kv.block import ceil_div

GB = 10**9
BLOCK = 16


@dataclass
class Run:
    """One configuration's requests: TTFT per request (with its pass) and totals."""

    name: str
    ttft_s: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    def revisit_ttfts(self) -> list[float]:
        return [t for pass_no, t in self.ttft_s if pass_no > 0]

    def summary(self) -> dict[str, Any]:
        revisits = self.revisit_ttfts()
        return {
            "name": self.name,
            "ttft_p50_ms": 1000 * statistics.median(revisits),
            "ttft_p99_ms": 1000 * percentile(revisits, 0.99),
            "ttft_first_pass_p50_ms": 1000
            * statistics.median([t for p, t in self.ttft_s if p == 0]),
            "throughput_tok_s": self.tokens / self.wall_s,
            "wall_s": self.wall_s,
            "requests": len(self.ttft_s),
            "host_hit_tokens": self.stats.get("host_hit_tokens", 0),
            "disk_hit_tokens": self.stats.get("disk_hit_tokens", 0),
            "prefix_hit_tokens": self.stats.get("prefix_hit_tokens", 0),
            "prefix_queried_tokens": self.stats.get("prefix_queried_tokens", 0),
        }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def load_once(model: str | None, max_len: int) -> LoadedModel:
    """The weights and tokenizer, shared by every engine of the run."""
    source = resolve_model(model)
    config = ModelConfig.from_hf(load_hf_config(source.folder))
    tokenizer = load_tokenizer(source.folder)
    weights = load_model(source, config, max_len, torch.device("cpu"), torch.float32)
    eos = eos_token_ids(source.folder, config, tokenizer)
    return LoadedModel(weights, config, tokenizer, eos, source.origin)


def make_engine(loaded: LoadedModel, num_blocks: int, max_len: int, **tiers: Any) -> LLMEngine:
    config = EngineConfig(
        device="cpu",
        dtype="float32",
        num_kv_blocks=num_blocks,
        max_model_len=max_len,
        **tiers,
    )
    engine = LLMEngine(config, assemble_engine_parts(config, loaded, time.monotonic()))
    engine.start()
    return engine


def ttft(engine: LLMEngine, prompt: list[int], new_tokens: int) -> tuple[float, int]:
    """Seconds to the first token, and tokens served (prompt + output)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    first: float | None = None
    stream = engine.add_request(prompt, params)
    for output in stream:
        if first is None and output.token_ids:
            first = time.perf_counter() - started
    assert first is not None, "the request produced no token"
    return first, len(prompt) + len(stream.token_ids)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def block_bytes(loaded: LoadedModel) -> int:
    c = loaded.model_config
    return int(c.num_layers * 2 * BLOCK * c.num_kv_heads * c.head_dim * 4)


def run_workload(
    loaded: LoadedModel, args: argparse.Namespace, disk_root: Path
) -> tuple[list[Run], dict[str, Any]]:
    rng = random.Random(0)
    docs = [random_tokens(rng, args.doc_len) for _ in range(args.docs)]
    per_request = ceil_div(args.doc_len + args.question_len + args.new_tokens, BLOCK)
    working_set = per_request * args.docs
    device_blocks = max(working_set // 4, per_request + 1)
    max_len = per_request * BLOCK
    nbytes = block_bytes(loaded)
    configs = {
        "tiers off": {},
        "host only": {"kv_host_gb": 1.1 * working_set * nbytes / GB},
        "host+disk": {
            "kv_host_gb": device_blocks * nbytes / GB,
            "kv_disk_gb": 2 * working_set * nbytes / GB,
            "kv_disk_path": str(disk_root / "workload"),
        },
    }
    schedule = []
    for pass_no in range(args.passes):
        order = list(range(args.docs))
        rng.shuffle(order)
        schedule += [(pass_no, i, random_tokens(rng, args.question_len)) for i in order]
    runs = []
    for name, tiers in configs.items():
        engine = make_engine(loaded, device_blocks, max_len, **tiers)
        run = Run(name)
        started = time.perf_counter()
        for pass_no, doc, question in schedule:
            seconds, tokens = ttft(engine, docs[doc] + question, args.new_tokens)
            run.ttft_s.append((pass_no, seconds))
            run.tokens += tokens
        run.wall_s = time.perf_counter() - started
        run.stats = engine.stats().to_dict()
        engine.shutdown()
        runs.append(run)
        print(f"  {name}: {run.wall_s:.1f}s", flush=True)
    shape = {"device_blocks": device_blocks, "working_set_blocks": working_set}
    return runs, {**shape, "block_bytes": nbytes, "configs": configs}


def run_long_prefix(
    loaded: LoadedModel, args: argparse.Namespace, disk_root: Path
) -> dict[str, Any]:
    rng = random.Random(1)
    first, second = (random_tokens(rng, args.long_len) for _ in range(2))
    question = random_tokens(rng, args.question_len)
    per_request = ceil_div(args.long_len + args.question_len + args.new_tokens, BLOCK)
    nbytes = block_bytes(loaded)
    tiers: dict[str, dict[str, Any]] = {
        "host": {"kv_host_gb": 1.05 * per_request * nbytes / GB},
        "disk": {
            "kv_disk_gb": 2.2 * per_request * nbytes / GB,
            "kv_disk_path": str(disk_root / "long"),
            "kv_disk_min_uses": 1,
        },
    }
    result: dict[str, Any] = {"prompt_tokens": args.long_len + args.question_len}
    for tier, settings in tiers.items():
        engine = make_engine(loaded, per_request + 2, per_request * BLOCK, **settings)
        cold, _ = ttft(engine, first + question, args.new_tokens)
        ttft(engine, second + question, args.new_tokens)  # pushes the first one down
        warm, _ = ttft(engine, first + question, args.new_tokens)
        stats = engine.stats()
        engine.shutdown()
        loaded_tokens = stats.host_hit_tokens if tier == "host" else stats.disk_hit_tokens
        result[tier] = {
            "recompute_ttft_ms": 1000 * cold,
            "tier_ttft_ms": 1000 * warm,
            "speedup": cold / warm,
            "tokens_loaded_from_tier": loaded_tokens,
            "cached_tokens": stats.prefix_hit_tokens,
        }
        print(f"  {tier}: cold {cold:.2f}s, from the {tier} tier {warm:.3f}s", flush=True)
    return result


def print_tables(runs: list[Run], long: dict[str, Any] | None) -> None:
    base = runs[0].summary()
    print(
        f"\n{'config':<10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tok/s':>9} "
        f"{'p50 vs off':>10} {'tok/s vs off':>12} {'host hit tok':>12} {'disk hit tok':>12}"
    )
    for run in runs:
        s = run.summary()
        print(
            f"{s['name']:<10} {s['ttft_p50_ms']:>12.1f} {s['ttft_p99_ms']:>12.1f} "
            f"{s['throughput_tok_s']:>9.1f} {base['ttft_p50_ms'] / s['ttft_p50_ms']:>9.2f}x "
            f"{s['throughput_tok_s'] / base['throughput_tok_s']:>11.2f}x "
            f"{s['host_hit_tokens']:>12} {s['disk_hit_tokens']:>12}"
        )
    if long:
        print(f"\nlong prefix ({long['prompt_tokens']} prompt tokens):")
        print(f"{'tier':<6} {'recompute ms':>13} {'from tier ms':>13} {'speed-up':>9}")
        for tier in ("host", "disk"):
            r = long[tier]
            print(
                f"{tier:<6} {r['recompute_ttft_ms']:>13.0f} {r['tier_ttft_ms']:>13.1f} "
                f"{r['speedup']:>8.1f}x"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-len", type=int, default=1024)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--long-len", type=int, default=8000)
    parser.add_argument("--skip-long", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--disk-path", default=None, help="folder for disk-tier files")
    parser.add_argument("--out", default="bench/results/offload.json")
    args = parser.parse_args()
    if args.quick:
        args.docs, args.doc_len, args.long_len = 4, 512, 2000
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    max_len = max(args.doc_len, args.long_len) + args.question_len + args.new_tokens + BLOCK
    loaded = load_once(args.model, max_len)
    with tempfile.TemporaryDirectory(dir=args.disk_path) as disk_root:
        print("workload:", flush=True)
        runs, shape = run_workload(loaded, args, Path(disk_root))
        long = None
        if not args.skip_long:
            print("long prefix:", flush=True)
            long = run_long_prefix(loaded, args, Path(disk_root))
    print_tables(runs, long)
    goal = None if long is None else long["host"]["speedup"] >= 5.0
    print(f"\ngoal: host-tier TTFT of the long prefix >= 5x faster than recompute: {goal}")
    report = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "load_average": [list(load_start), list(os.getloadavg())],
        },
        "config": {k: v for k, v in vars(args).items()},
        "workload": {**shape, "runs": [run.summary() for run in runs]},
        "long_prefix": long,
        "goal_host_speedup_5x": goal,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
