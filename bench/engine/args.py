"""The command line of ``bench/engine/throughput.py`` (see its docstring for what it measures)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.engine import cuda as engine_cuda
from bench.engine.report import BenchConfig

FULL_BATCHES = (1, 8, 32)
QUICK_BATCHES = (1, 8)
FULL_NEW_TOKENS = 128
QUICK_NEW_TOKENS = 32
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "engine.json"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def batch_sizes(text: str) -> tuple[int, ...]:
    return tuple(positive_int(part) for part in text.split(","))


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path]:
    parser = argparse.ArgumentParser(description="Built-in engine against HF transformers")
    parser.add_argument("--batches", type=batch_sizes, help="comma-separated (default 1,8,32)")
    parser.add_argument("--prompt-len", type=positive_int, default=256)
    parser.add_argument("--new-tokens", type=positive_int, help="per request (default 128)")
    parser.add_argument("--ttft-prompt-len", type=positive_int, default=1000)
    parser.add_argument("--ttft-trials", type=positive_int, default=3)
    parser.add_argument("--repeats", type=positive_int, default=1, help="best run is kept")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--skip-hf", action="store_true", help="measure our engine only")
    parser.add_argument("--quick", action="store_true", help="batches 1,8 and 32 new tokens")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bf16 on GPU")
    parser.add_argument(
        "--random-model", choices=sorted(engine_cuda.RANDOM_MODELS), help="random weights"
    )
    parser.add_argument("--tokenizer", help="tokenizer folder for --random-model")
    parser.add_argument("--hf-batches", type=batch_sizes, help="batches HF runs (default all)")
    parser.add_argument("--prefill-lens", type=batch_sizes, help="prefill tok/s (GPU runs)")
    parser.add_argument("--max-num-seqs", type=positive_int, help="engine's (default: max batch)")
    parser.add_argument("--max-batched-tokens", type=positive_int, default=2048)
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="lower it to leave HF room"
    )
    parser.add_argument("--vllm", action="store_true", help="also out=vllm (engine_vllm.py)")
    parser.add_argument(
        "--decode-burst",
        type=batch_sizes,
        default=(1,),
        help="engine's decode_burst (1: off); several (1,8): each batch runs with each",
    )
    parser.add_argument(
        "--async-scheduling",
        choices=("auto", "on", "off"),
        default="auto",
        help="engine's async_scheduling (auto: on for CUDA)",
    )
    parser.add_argument(
        "--cuda-fast-paths",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine's cuda_fast_paths (default on; --no-cuda-fast-paths: the kernels of before)",
    )
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
        device=args.device,
        dtype=args.dtype,
        random_model=args.random_model,
        tokenizer=args.tokenizer,
        hf_batches=args.hf_batches,
        prefill_lens=args.prefill_lens or (),
        max_num_seqs=args.max_num_seqs or max(64, *batches),
        max_batched_tokens=args.max_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        vllm=args.vllm,
        decode_bursts=args.decode_burst,
        async_scheduling=args.async_scheduling,
        cuda_fast_paths=args.cuda_fast_paths,
    )
    return config, args.out
