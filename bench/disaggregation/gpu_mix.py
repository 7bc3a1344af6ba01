"""Aggregated vs disaggregated serving on ONE GPU: a long-prompt mix through ``dynask run``.

Both set-ups hold the same memory: two engines at ``--gpu-memory-utilization`` (default
0.42 each) on one GPU, on the saved random-weight model of ``bench.serving.gpu_stack``
(Llama-3.1-8B's shape). ``agg``: ``--workers 2 --engines-per-gpu 2`` (each engine
prefills and decodes; requests routed between them). ``disagg``: ``--prefill-workers 1
--decode-workers 1 --kv-transport cuda_ipc`` (the prefill engine's blocks are copied
device to device into the decode engine's reserved blocks).

Per set-up: the same three greedy prompts (one 8k-token, two short) must give the same
text (disaggregated output equals aggregated); then, per ``--rates`` value, Poisson
arrivals of ``--requests`` streaming ``/v1/completions`` requests, ``--long-share`` of
them ~``--long-tokens``-token prompts, the rest ~``--short-tokens``-token chats, each
``--max-tokens`` tokens (EOS ignored). Per rate: TTFT and ITL p50/p99 (all, long,
short) and goodput in DistServe's sense: completed requests per second that met both
SLOs, TTFT <= ``--ttft-slo-ms`` and time per output token <= ``--tpot-slo-ms``.

    python -m bench.disaggregation.gpu_mix --tokenizer .devcarry/tokenizer
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common.load import build_prompts, completion_body, stream_completion
from bench.common.processes import free_port, spawned, wait_until_ready
from bench.serving.gpu_stack import save_random_model

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "disagg-mix-h200.json"
MODES = {
    "agg": ["--workers", "2", "--engines-per-gpu", "2"],
    "disagg": [
        "--prefill-workers", "1", "--decode-workers", "1", "--engines-per-gpu", "2",
        "--kv-transport", "cuda_ipc",
    ],
}  # fmt: skip


def run_argv(mode: str, port: int, args: argparse.Namespace) -> list[str]:
    import sys

    return [
        sys.executable, "-m", "dynask.control_plane.cli", "run", str(args.model_dir),
        "--device", "cuda", "--port", str(port),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--max-model-len", str(args.long_tokens + 1024), "--max-num-seqs", "32",
        "--max-num-batched-tokens", "8192",
        "--database-url", f"sqlite:///{args.workdir / (mode + '.db')}", *MODES[mode],
    ]  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def poisson_window(
    base_url: str, model: str, prompts: list[tuple[str, str]], rate: float, args: Any
) -> dict[str, Any]:
    rng = random.Random(int(rate * 1000))
    limits = httpx.Limits(max_connections=len(prompts))
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=600) as client:

        async def one(kind: str, prompt: str, delay: float) -> tuple[str, Any]:
            await asyncio.sleep(delay)
            body = completion_body(model, prompt, args.max_tokens)
            return kind, await stream_completion(client, body)

        delays, t = [], 0.0
        for _ in prompts:
            t += rng.expovariate(rate)
            delays.append(t)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one(k, p, d) for (k, p), d in zip(prompts, delays, strict=True))
        )
        wall = time.perf_counter() - start
    row: dict[str, Any] = {"rate": rate, "wall_s": wall}
    met = 0
    for group in ("all", "long", "short"):
        chosen = [
            r for k, r in results if group in ("all", k) and r.failure(args.max_tokens) is None
        ]
        ttfts = [r.ttft_s for r in chosen if r.ttft_s is not None]
        gaps = [g for r in chosen for g in r.gaps_s]
        row[group] = {
            "ok": len(chosen),
            "ttft_p50_ms": percentile(ttfts, 0.5),
            "ttft_p99_ms": percentile(ttfts, 0.99),
            "itl_p50_ms": percentile(gaps, 0.5),
            "itl_p99_ms": percentile(gaps, 0.99),
        }
        if group == "all":
            for r in chosen:
                tpot = (r.done_s - r.ttft_s) / max(1, args.max_tokens - 1)
                if r.ttft_s * 1e3 <= args.ttft_slo_ms and tpot * 1e3 <= args.tpot_slo_ms:
                    met += 1
    row["failed"] = len(results) - row["all"]["ok"]
    row["slo_attainment"] = met / len(results)
    row["goodput_req_per_s"] = met / wall
    return row


def measure_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    greedy = build_prompts(tokenizer, 1, args.long_tokens, "greedy-long") + build_prompts(
        tokenizer, 2, args.short_tokens, "greedy-short"
    )
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with spawned(f"mix-{mode}", run_argv(mode, port, args), args.workdir) as server:
        started = time.perf_counter()
        # /ready: every deployment up. /health turns ready with the first engine, and a
        # request sent then lands on the prefill engine alone (no disaggregation).
        wait_until_ready(f"{base_url}/ready", '"ready"', args.ready_timeout, [server])
        ready_s = time.perf_counter() - started
        print(f"{mode}: ready in {ready_s:.0f} s", flush=True)
        model = httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]
        texts = []
        for prompt in greedy:
            body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                    "ignore_eos": True}  # fmt: skip
            reply = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120).json()
            texts.append(reply["choices"][0]["text"])
        rows = []
        for rate in args.rates:
            rng = random.Random(f"{mode}-{rate}")
            kinds = [
                "long" if rng.random() < args.long_share else "short" for _ in range(args.requests)
            ]
            longs = build_prompts(
                tokenizer, kinds.count("long"), args.long_tokens, f"L{mode}{rate}"
            )
            shorts = build_prompts(
                tokenizer, kinds.count("short"), args.short_tokens, f"S{mode}{rate}"
            )
            pool = {"long": iter(longs), "short": iter(shorts)}
            prompts = [(k, next(pool[k])) for k in kinds]
            row = asyncio.run(poisson_window(base_url, model, prompts, rate, args))
            rows.append(row)
            print(format_row(mode, row), flush=True)
        stats = httpx.get(f"{base_url}/metrics", timeout=10).text
    transfer_lines = [
        line for line in stats.splitlines() if "disagg" in line and not line.startswith("#")
    ]
    return {"mode": mode, "ready_s": ready_s, "greedy_texts": texts, "rows": rows,
            "kv_transfer_metrics": transfer_lines[:20]}  # fmt: skip


def format_row(mode: str, row: dict[str, Any]) -> str:
    def ms(group: str, key: str) -> str:
        value = row[group][key]
        return "-" if value is None else f"{value:.0f}"

    ok = f"{row['all']['ok']}/{row['all']['ok'] + row['failed']}"
    cells = [ms("all", "ttft_p50_ms"), ms("all", "ttft_p99_ms"), ms("long", "ttft_p50_ms")]
    cells += [ms("short", "ttft_p50_ms"), ms("all", "itl_p50_ms"), ms("all", "itl_p99_ms")]
    return (
        f"{mode:>6} {row['rate']:>5g} {ok:>9} "
        + " ".join(f"{c:>7}" for c in cells)
        + f" {row['slo_attainment']:>6.0%} {row['goodput_req_per_s']:>7.2f}"
    )


HEADER = (
    f"{'mode':>6} {'rate':>5} {'ok':>9} {'TTFT50':>7} {'TTFT99':>7} {'long50':>7} {'short50':>7} "
    f"{'ITL50':>7} {'ITL99':>7} {'SLO':>6} {'goodput':>7}"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/dynask-random-llama-8b"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dynask-gpu-mix"))
    parser.add_argument("--modes", default="agg,disagg")
    parser.add_argument("--rates", default="2,4", help="requests per second (Poisson)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--long-share", type=float, default=0.3)
    parser.add_argument("--long-tokens", type=int, default=8000)
    parser.add_argument("--short-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=50.0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.42)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    save_random_model(args.model_dir, args.tokenizer, "llama-8b")
    print(HEADER, flush=True)
    results = [measure_mode(mode, args) for mode in args.modes.split(",")]
    print("\n" + HEADER)
    for result in results:
        for row in result["rows"]:
            print(format_row(result["mode"], row))
    same = len({tuple(r["greedy_texts"]) for r in results}) == 1
    print(f"greedy texts equal across {args.modes}: {same}")
    for result in results:  # a disaggregated run that moved no KV measured no disaggregation
        moved = [m for m in result["kv_transfer_metrics"] if "transferred_blocks" in m]
        print(f"{result['mode']}: {'; '.join(moved) or 'no KV transfer metrics'}")
    import torch

    out = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "greedy_equal": same,
        "results": results,
        "mean_goodput": {
            r["mode"]: statistics.mean(x["goodput_req_per_s"] for x in r["rows"]) for r in results
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
