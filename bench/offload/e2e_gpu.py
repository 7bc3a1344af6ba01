"""KV offload end to end on a GPU: a revisited 8k-token prefix from the host tier vs recomputed.

The built-in engine on a saved random-weight model (``bench.serving.gpu_stack``'s
folder, Llama-3.1-8B's shape) with a small GPU cache (``--gpu-blocks``, default 1,200
blocks = 19,200 tokens), once with a host tier (``--kv-host-gb``) and once without. Per
engine: a request on an 8k-token prefix P (cold), two other 8k prompts that evict P from
the GPU cache, then P again with a new 32-token question — its TTFT (one output token)
and the prompt tokens served from a cache; then, after evicting P again, ``--batch``
requests on P with ``--new-tokens`` tokens each: wall time and output tok/s. Without the
host tier the revisit recomputes P; with it, P's blocks come back from host memory.

    python -m bench.offload.e2e_gpu --tokenizer .devcarry/tokenizer
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.serving.gpu_stack import save_random_model
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "offload-e2e-h200.json"


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(1000, 120000) for _ in range(count)]


def one_engine(args: argparse.Namespace, host_gb: float) -> dict[str, Any]:
    config = EngineConfig(
        model=str(args.model_dir), device="cuda", num_kv_blocks=args.gpu_blocks,
        max_model_len=args.prefix_tokens + 512, max_num_batched_tokens=8192,
        max_num_seqs=16, kv_host_gb=host_gb,
    )  # fmt: skip
    engine = LLMEngine(config)
    rng = random.Random(0)
    prefix = tokens(rng, args.prefix_tokens)
    others = [tokens(rng, args.prefix_tokens) for _ in range(4)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate([tokens(rng, 64)], one)  # warm-up

    def timed(prompts: list[list[int]], params: SamplingParams) -> tuple[float, Any]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        streams = engine.generate(prompts, params)
        return time.perf_counter() - start, streams

    cold_s, _ = timed([prefix + tokens(rng, 32)], one)
    timed(others[:2], one)  # evicts P from the GPU cache
    revisit_s, streams = timed([prefix + tokens(rng, 32)], one)
    cached = streams[0].usage.cached_tokens
    timed(others[2:], one)
    many = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    batch_s, _ = timed([prefix + tokens(rng, 32) for _ in range(args.batch)], many)
    engine.shutdown()
    return {
        "kv_host_gb": host_gb,
        "cold_ttft_ms": cold_s * 1e3,
        "revisit_ttft_ms": revisit_s * 1e3,
        "revisit_cached_tokens": cached,
        "batch_wall_s": batch_s,
        "batch_output_tok_per_s": args.batch * args.new_tokens / batch_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer files folder")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/dynask-random-llama-8b"))
    parser.add_argument("--gpu-blocks", type=int, default=1200)
    parser.add_argument("--kv-host-gb", type=float, default=16.0)
    parser.add_argument("--prefix-tokens", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    save_random_model(args.model_dir, args.tokenizer, "llama-8b")
    rows = []
    for host_gb in (0.0, args.kv_host_gb):
        rows.append(one_engine(args, host_gb))
        gc.collect()  # the engine's cache and weights go before the next one loads
        torch.cuda.empty_cache()
    head = ("host tier", "cold ms", "revisit ms", "cached", "batch s", "tok/s")
    print("{:>10} {:>9} {:>11} {:>7} {:>8} {:>7}".format(*head))
    for r in rows:
        print(
            f"{r['kv_host_gb']:>8g}GB {r['cold_ttft_ms']:>9.1f} {r['revisit_ttft_ms']:>11.1f} "
            f"{r['revisit_cached_tokens']:>7} {r['batch_wall_s']:>8.2f} "
            f"{r['batch_output_tok_per_s']:>7.0f}"
        )
    recompute, offload = rows
    result = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "config": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
        "revisit_ttft_speedup": recompute["revisit_ttft_ms"] / offload["revisit_ttft_ms"],
        "batch_throughput_ratio": (
            offload["batch_output_tok_per_s"] / recompute["batch_output_tok_per_s"]
        ),
    }
    print(
        f"revisit TTFT: {result['revisit_ttft_speedup']:.2f}x faster from the host tier; "
        f"batch throughput {result['batch_throughput_ratio']:.2f}x"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
